"""Resident memory over a long run of pages of random sizes: PaddleX serving against the service, both on PaddleX's
OCR pipeline file, both through ``POST /ocr``:

    python benchmarks/ocr_memory.py [--pages 360] [--clients 4] [--every 60] [--servers PaddleX ours]
                                    [--ours-flag=--no-keep-host-memory ...] [--ours-engine onnxruntime]

Each server runs alone (the other stopped): started, warmed up with one pass over 24 pages at c=1 (its
resident memory then is "after warm-up"), then ``--pages`` pages at ``--clients`` concurrent clients, each
page one of loadtest/pages.py's 24 scaled by its own random factors in x and y (0.5 to 1.6: every page a new
shape, as documents are), its resident memory (every process of its session: uvicorn's and Paddle's children
too) read every ``--every`` pages. Every answer must be ``errorCode`` 0: a failed request is counted and
printed. Prints a Markdown table with the date, the machine and the command, and each server's samples after
warm-up (median, min..max: each sample is a moment, a large page's run in flight or not) and ``IDLE_S``
after the last page (what it keeps with no run in flight); writes
results/ocr_memory.json. The servers are those of benchmarks/paddlex_serving.py (its PaddleX reference venv
and PP-OCRv5 exports).
"""

from __future__ import annotations

import argparse
import datetime
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import cv2
import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import paddlex_serving as serving  # noqa: E402

from bench_service import save_results  # noqa: E402


def scaled_pages(count: int, seed: int) -> list[bytes]:
    """``count`` PNG pages, each one of the 24 base pages scaled by random factors in x and y."""
    rng = random.Random(seed)
    base = [cv2.imdecode(np.frombuffer(p.data, np.uint8), cv2.IMREAD_COLOR) for p in serving.page_maker.pages(24)]
    found = []
    for i in range(count):
        image = base[i % len(base)]
        fx, fy = rng.uniform(0.5, 1.6), rng.uniform(0.5, 1.6)
        found.append(cv2.imencode(".png", cv2.resize(image, None, fx=fx, fy=fy, interpolation=cv2.INTER_AREA))[1]
                     .tobytes())
    return found


#: Seconds after the last page before the idle sample: a server's last runs end, and what it gives back at
#: their end (ours: a session's buffers, the heap's free pages) is given back.
IDLE_S = 5


def run(server: serving.Process, warmup: list[bytes], pages: list[bytes], clients: int, every: int) -> dict:
    """Warm up at c=1, then ``pages`` at ``clients``: resident memory after warm-up and every ``every`` pages."""
    serving.sequential(serving.OcrApi(server.url, warmup), len(warmup), 1)
    api = serving.OcrApi(server.url, pages)
    samples = [(0, server.resident_mib())]
    serving.say(f"{server.name}: {samples[0][1]:.0f} MiB after warm-up")
    lock, next_page, done, failed = threading.Lock(), [0], [0], []

    def client_loop() -> None:
        with httpx.Client(timeout=300) as client:
            while True:
                with lock:
                    page = next_page[0]
                    next_page[0] += 1
                if page >= len(pages):
                    return
                try:
                    api(client, page)
                except Exception as exc:  # noqa: BLE001 - counted and said
                    with lock:
                        failed.append(f"page {page}: {type(exc).__name__}: {str(exc)[:200]}")
                with lock:
                    done[0] += 1
                    if done[0] % every == 0:
                        samples.append((done[0], server.resident_mib()))
                        serving.say(f"{server.name}: {samples[-1][1]:.0f} MiB after {done[0]} pages")

    began = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - began
    # What it keeps once no request is in flight (the samples above catch runs in flight or not).
    time.sleep(IDLE_S)
    return {"pages_per_s": len(pages) / seconds, "samples": samples, "failed": failed,
            "start_s": server.start_s, "idle_mib": server.resident_mib()}


def table(found: dict, argv: list[str]) -> str:
    lines = [f"{datetime.date.today().isoformat()}, {serving.machine()}; `{shlex.join(['python', *argv])}`", "",
             "| | pages/s | RSS after warm-up, MiB | " + " | ".join(
                 f"after {n}" for n, _ in next(iter(found.values()))["samples"][1:]) + " | growth | failed |",
             "|---|---:|---:|" + "---:|" * (len(next(iter(found.values()))["samples"]) - 1) + "---:|---:|"]
    for name, one in found.items():
        values = [mib for _, mib in one["samples"]]
        lines.append(f"| {name} | {one['pages_per_s']:.2f} | {values[0]:,.0f} | "
                     + " | ".join(f"{v:,.0f}" for v in values[1:]) + f" | {values[-1] - values[0]:+,.0f} | "
                     f"{len(one['failed'])} |")
    # Each sample is a moment: a detector's run in flight on a large page holds hundreds of MiB, so the samples
    # after warm-up, as a whole, say more than the last one alone.
    lines += ["", f"| | samples after warm-up: median, MiB | min..max | median - after warm-up | idle {IDLE_S} s after "
              "the last page | idle - after warm-up |", "|---|---:|---:|---:|---:|---:|"]
    for name, one in found.items():
        values = [mib for _, mib in one["samples"]]
        lines.append(f"| {name} | {statistics.median(values[1:]):,.0f} | {min(values[1:]):,.0f}.."
                     f"{max(values[1:]):,.0f} | {statistics.median(values[1:]) - values[0]:+,.0f} | "
                     f"{one['idle_mib']:,.0f} | {one['idle_mib'] - values[0]:+,.0f} |")
    if len(found) == 2:
        (a, b), (c, d) = ((found[n]["samples"][-1][1], statistics.median(mib for _, mib in found[n]["samples"][1:]))
                          for n in found)
        lines.append(f"\n{list(found)[1]} ends at {c / a:.2f}x {list(found)[0]}'s resident memory; the median of "
                     f"its samples after warm-up is {d / b:.2f}x {list(found)[0]}'s.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=360)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--every", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--servers", nargs="+", default=["PaddleX", "ours"], choices=["PaddleX", "ours"])
    parser.add_argument("--ours-flag", action="append", default=[], help="a flag for ours (repeatable)")
    parser.add_argument("--ours-engine", default=None,
                        help="ours: each module's engine (onnxruntime, openvino, paddle_static) in place of auto")
    parser.add_argument("--deadline", type=float, default=300, help="seconds a server has to be ready")
    args = parser.parse_args()
    warmup = [p.data for p in serving.page_maker.pages(24)]
    pages = scaled_pages(args.pages, args.seed)
    found = {}
    with tempfile.TemporaryDirectory(prefix="ocr-memory-") as scratch:
        tmp = Path(scratch)
        pipeline = serving.reference.pipeline_file(tmp)
        (tmp / "repository" / serving.MODEL).mkdir(parents=True)
        text = pipeline.read_text()
        if args.ours_engine:
            for kind in ("text_detection", "text_recognition"):
                text = text.replace(f"    module_name: {kind}\n", f"    module_name: {kind}\n    engine: {args.ours_engine}\n")
        (tmp / "repository" / serving.MODEL / "pipeline.yaml").write_text(text)
        for name in args.servers:
            serving.say(f"starting {name}")
            server = (serving.start_paddlex(pipeline, tmp, args.deadline) if name == "PaddleX" else
                      serving.start_ours(tmp / "repository", tmp, args.deadline, flags=tuple(args.ours_flag)))
            try:
                found[name] = run(server, warmup, pages, args.clients, args.every)
            except Exception:
                print(server.tail(), file=sys.stderr)
                raise
            finally:
                server.stop()
            for problem in found[name]["failed"][:5]:
                print(f"{name}: {problem}", file=sys.stderr)
    print()
    print(table(found, sys.argv))
    save_results("ocr_memory", args, servers=found)


if __name__ == "__main__":
    main()
