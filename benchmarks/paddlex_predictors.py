"""The OCR pipeline's two networks on 2 cores: one process with Predictors of 2 math threads (what one
service process does: a Predictor's run holds the GIL, so its runs take turns) against two processes with
Predictors of 1 thread each, running side by side (what a GIL-free run or a process per core would allow):

    python benchmarks/paddlex_predictors.py [--rounds 3] [--pages 8]

Each process runs the PP-OCRv5_mobile det and rec exports (tests/support/paddlex_processors_demo.py: as
PaddleX's PaddleStaticRunner configures them, det oneDNN off, rec on) over the same generated pages: the
one process every page, the two processes half each. Rounds alternate the order; prints the wall times
and their ratio (one process / two), median (min..max).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _worker(threads: int, pages: list[int], ready, go, out) -> None:
    os.environ["PADDLE_PDX_CPU_NUM_THREADS"] = str(threads)  # read when the demo module is imported
    sys.path.insert(0, str(ROOT))
    from tests.support import paddlex_processors_demo as demo
    from tests.support import paddlex_reference as reference
    from loadtest import pages as page_maker

    datas = [page_maker.page(i).data for i in pages]
    ocr = demo.OCR(reference.models())
    ocr(datas[0])  # the predictors' first runs
    ready.set()
    go.wait()
    began = time.perf_counter()
    for data in datas:
        ocr(data)
    out.put(time.perf_counter() - began)


def run(shares: list[tuple[int, list[int]]]) -> float:
    """Wall seconds for processes (threads, pages) started together, from the common start to the last."""
    context = multiprocessing.get_context("spawn")
    go, out = context.Event(), context.Queue()
    readies = [context.Event() for _ in shares]
    procs = [context.Process(target=_worker, args=(threads, pages, ready, go, out))
             for (threads, pages), ready in zip(shares, readies)]
    for proc in procs:
        proc.start()
    for ready in readies:
        ready.wait(600)
    go.set()
    times = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    return max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pages", type=int, default=8)
    args = parser.parse_args()
    pages = list(range(args.pages))
    print(f"{time.strftime('%H:%M:%S')} one process (2 threads) vs two (1 thread each), {args.pages} pages, "
          f"{args.rounds} rounds; nproc {os.cpu_count()}", flush=True)
    ones, twos = [], []
    for number in range(args.rounds):
        ways = [("one", [(2, pages)]), ("two", [(1, pages[0::2]), (1, pages[1::2])])]
        for name, shares in (ways if number % 2 == 0 else ways[::-1]):
            seconds = run(shares)
            (ones if name == "one" else twos).append(seconds)
            print(f"{time.strftime('%H:%M:%S')} round {number + 1} {name}: {seconds:.2f} s", flush=True)
    ratio = [a / b for a, b in zip(ones, twos)]
    form = lambda v: f"{statistics.median(v):.2f} ({min(v):.2f}..{max(v):.2f})"  # noqa: E731
    print(f"\n| way | s for {args.pages} pages |\n|---|---:|\n| one process, 2 threads | {form(ones)} |\n"
          f"| two processes, 1 thread each | {form(twos)} |\n| one / two | {form(ratio)} |")


if __name__ == "__main__":
    main()
