"""OpenMP's spin after a parallel region (``KMP_BLOCKTIME``) and the OCR pipeline's two Predictors:

    python benchmarks/openmp_blocktime.py [--rounds 6] [--values 200 1 0]

A page as the service runs it: the PP-OCRv5_mobile det Predictor (oneDNN off, as PaddleX's pipeline file
has it) on one worker thread, then two rec batches (oneDNN on) handed to a second worker thread, as the
engine's workers take a pipeline's jobs, each thread with a team of math threads of its own; against the
same page with every run on one thread (PaddleX serving's way). Both Predictors take 10 math threads,
PaddleX's default. Each blocktime value runs in a fresh interpreter (the runtime reads it once, at its
first parallel region), the values interleaved per round; prints each value's wall and CPU (the process's
user + system) milliseconds a page, median (min..max) of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PAGE = r"""
import json, os, queue, sys, threading, time
import numpy as np
import paddle.inference as pi
sys.path.insert(0, sys.argv[1])
from tests.support import ocr_models

models = ocr_models.models()

def predictor(kind, onednn):
    config = pi.Config(str(models[kind] / "inference.json"), str(models[kind] / "inference.pdiparams"))
    config.disable_glog_info(); config.disable_gpu(); config.set_cpu_math_library_num_threads(10)
    config.enable_mkldnn() if onednn else config.disable_mkldnn()
    return pi.create_predictor(config)

def run(p, x):
    handle = p.get_input_handle(p.get_input_names()[0]); handle.reshape(x.shape); handle.copy_from_cpu(x)
    p.run()
    return p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()

det, rec = predictor("det", False), predictor("rec", True)
rng = np.random.default_rng(0)
page, lines = rng.random((1, 3, 800, 1184), "float32"), rng.random((6, 3, 48, 480), "float32")

class Worker(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True); self.jobs = queue.Queue(); self.start()
    def run(self):
        while True:
            p, x, done = self.jobs.get(); run(p, x); done.set()
    def call(self, p, x):
        done = threading.Event(); self.jobs.put((p, x, done)); done.wait()

first, second = Worker(), Worker()

def one_page(handed):
    first.call(det, page)
    for _ in range(2):
        (second if handed else first).call(rec, lines)

found = {}
for handed in (False, True):
    one_page(handed); one_page(handed)
    wall, cpu = [], []
    for _ in range(4):
        w, c = time.perf_counter(), time.process_time()
        one_page(handed)
        wall.append(time.perf_counter() - w); cpu.append(time.process_time() - c)
    found["handed" if handed else "one thread"] = (sorted(wall)[1:3], sorted(cpu)[1:3])
print(json.dumps(found))
"""


def once(value: str) -> dict:
    env = {**os.environ, "KMP_BLOCKTIME": value}
    done = subprocess.run([sys.executable, "-c", PAGE, str(ROOT)], env=env, capture_output=True, text=True,
                          timeout=600)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--values", nargs="+", default=["200", "1", "0"])
    args = parser.parse_args()
    rows: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for round_ in range(args.rounds):
        order = args.values if round_ % 2 == 0 else args.values[::-1]
        for value in order:
            for way, (wall, cpu) in once(value).items():
                walls, cpus = rows.setdefault((value, way), ([], []))
                walls.append(1000 * statistics.mean(wall))
                cpus.append(1000 * statistics.mean(cpu))
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.0f} ({min(values):.0f}..{max(values):.0f})"

    print(f"\n{os.cpu_count()} cores; {args.rounds} rounds\n")
    print("| KMP_BLOCKTIME | runs | wall ms a page | CPU ms a page |")
    print("|---|---|---:|---:|")
    for (value, way), (walls, cpus) in rows.items():
        print(f"| {value} | {way} | {spread(walls)} | {spread(cpus)} |")


if __name__ == "__main__":
    main()
