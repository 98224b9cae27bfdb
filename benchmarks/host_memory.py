"""glibc's malloc keeping freed memory (``--keep-host-memory``, ``config.keep_freed_memory``) against its
defaults, on the OCR pipeline's pages:

    python benchmarks/host_memory.py [--rounds 5] [--pages 12]

Each variant is a process of its own, kept alive across rounds (glibc reads its MALLOC_* variables once,
at start; ``mallopt`` decides the arenas of threads started after it): PaddleX's OCR pipeline as
tests/support/paddlex_processors_demo.py runs it (PaddleX's processors, the PP-OCRv5_mobile det and rec
Predictors as PaddleX configures them, 10 math threads), each Predictor run handed to a worker thread as
the engine's workers take a pipeline's jobs (det on one pool of 2, rec on another). The variants:

* ``defaults``: glibc's own (what PaddleX serving runs with);
* ``keep``: ``keep_freed_memory(1 GiB)`` called before Paddle is imported, as a service process does with
  ``--keep-host-block-mib 1024`` (every block kept: what docs/benchmarks.md's table measured);
* ``no-arena``: the mmap and trim thresholds alone, each thread keeping an arena of its own;
* ``main-thread``: glibc's defaults, every run on the main thread (PaddleX's own pipeline call).

Each round passes over the same pages once in each process, the others idle, the order rotating per round;
prints each variant's wall and CPU (user + system) seconds a pass and its ratio to ``defaults``, median
(min..max) of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PASS = r"""
import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, sys.argv[1])
variant, pages = sys.argv[2], int(sys.argv[3])
if variant in ("keep", "no-arena"):  # no-arena: MALLOC_ARENA_MAX is in its environment, which wins
    from placeenv.serve.config import keep_freed_memory
    keep_freed_memory(1 << 30)
from tests.support import paddlex_processors_demo as demo
from tests.support import ocr_models
from loadtest import pages as page_maker

datas = [p.data for p in page_maker.pages(pages)]
ocr = demo.OCR(ocr_models.models().get("det").parent)
if variant != "main-thread":
    det_pool, rec_pool, run = ThreadPoolExecutor(2), ThreadPoolExecutor(2), demo.run
    demo.run = lambda p, x: (rec_pool if p is ocr.rec else det_pool).submit(run, p, x).result()
for data in datas:  # the Predictors' first runs, at every page's shapes
    ocr(data)
print("ready", flush=True)
for _ in sys.stdin:
    wall, cpu = time.perf_counter(), time.process_time()
    for data in datas:
        ocr(data)
    print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}), flush=True)
"""

VARIANTS = ("defaults", "keep", "no-arena", "main-thread")


def spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pages", type=int, default=12)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    # glibc's own arena count (8 a core on 64-bit), given in the environment: keep_freed_memory leaves it.
    arenas = {"MALLOC_ARENA_MAX": str(8 * (os.cpu_count() or 1))}
    procs = {name: subprocess.Popen([sys.executable, "-c", PASS, str(ROOT), name, str(args.pages)],
                                    env={**env, **arenas} if name == "no-arena" else env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for name in args.variants}
    for name, proc in procs.items():
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{name}: not ready ({line!r})")
    print(time.strftime("%H:%M:%S"), f"{args.rounds} rounds of {args.pages} pages; {os.cpu_count()} CPUs", flush=True)
    found: dict[str, list[dict]] = {name: [] for name in procs}
    names = list(procs)
    for index in range(args.rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            procs[name].stdin.write("go\n")
            procs[name].stdin.flush()
            found[name].append(json.loads(procs[name].stdout.readline()))
        print(time.strftime("%H:%M:%S"), index, {n: round(found[n][-1]["wall"], 2) for n in names}, flush=True)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait(60)
    base = found[names[0]]
    print(f"\n| variant | wall s a pass | CPU s a pass | wall / {names[0]} | CPU / {names[0]} |\n|---|---:|---:|---:|---:|")
    for name in names:
        rows = found[name]
        print(f"| {name} | {spread([r['wall'] for r in rows])} | {spread([r['cpu'] for r in rows])} | "
              f"{spread([r['wall'] / b['wall'] for r, b in zip(rows, base)], 3)} | "
              f"{spread([r['cpu'] / b['cpu'] for r, b in zip(rows, base)], 3)} |")


if __name__ == "__main__":
    main()
