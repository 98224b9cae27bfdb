"""PP-OCRv5_mobile's text detector with oneDNN off (what PaddleX's pipeline file must ask for on Paddle 3.3,
``run_mode: paddle``) against oneDNN's fused convolutions only (``inference: {onednn_ops: fused}``, what
the service rebuilds it with when all of oneDNN's kernels cannot run it):

    python benchmarks/onednn_fused.py [--rounds 5] [--pages 24]

Both Predictors are built in one process by the service's own ``inference.create`` (10 math threads,
PaddleX's default). The generated pages of loadtest/pages.py go through PaddleX's det preprocessing
(tests/support/paddlex_processors_demo.py); each round runs every page through both, the order alternating
per round. Prints the wall milliseconds a page (median (min..max) of the rounds) and their ratio; then the
two detectors' maps' largest difference, and the whole OCR pipeline's answers (PaddleX's processors, the
recogniser as PaddleX runs it) with each detector: pages whose texts differ, the largest polygon and
score differences.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from host_memory import spread  # noqa: E402  (beside this script)
from loadtest import pages as page_maker  # noqa: E402
from tests.support import ocr_models  # noqa: E402
from tests.support import paddlex_processors_demo as demo  # noqa: E402

from placeenv.serve.models import inference  # noqa: E402


def detector(onednn_ops: str | None):
    import paddle

    options = inference.InferenceOptions(onednn=onednn_ops is not None, onednn_ops=onednn_ops or "all",
                                         cpu_threads=demo.CPU_THREADS)
    return inference.create(ocr_models.models()["det"] / "inference", paddle.CPUPlace(), options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pages", type=int, default=24)
    args = parser.parse_args()
    datas = [p.data for p in page_maker.pages(args.pages)]
    ocr = demo.OCR(ocr_models.models()["det"].parent)
    inputs = []
    for data in datas:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        resized, _ = ocr.det_resize([image], limit_side_len=demo.DET["limit_side_len"],
                                    limit_type=demo.DET["limit_type"], max_side_limit=demo.DET["max_side_limit"])
        inputs.append(ocr.det_batch(ocr.det_chw(ocr.det_normalize(resized)))[0])
    variants = {"oneDNN off": detector(None), "fused only": detector("fused")}
    maps = {name: [demo.run(p, x)[0] for x in inputs] for name, p in variants.items()}  # first runs, each shape
    print(time.strftime("%H:%M:%S"), f"{args.rounds} rounds of {len(inputs)} pages", flush=True)
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for index in range(args.rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            began = time.perf_counter()
            for x in inputs:
                demo.run(variants[name], x)
            times[name].append(1000 * (time.perf_counter() - began) / len(inputs))
        print(time.strftime("%H:%M:%S"), index, {n: round(times[n][-1]) for n in names}, flush=True)
    ratios = [f / o for f, o in zip(times["fused only"], times["oneDNN off"])]
    print(f"\n| detector | ms a page |\n|---|---:|\n| oneDNN off | {spread(times['oneDNN off'], 0)} |\n"
          f"| fused only | {spread(times['fused only'], 0)} |\n| fused / off | {spread(ratios, 3)} |")
    largest = max(float(np.abs(a - b).max()) for a, b in zip(maps["oneDNN off"], maps["fused only"]))
    print(f"\nlargest difference of the maps (probabilities, 0..1): {largest:.2e}")
    answers = {}
    for name, predictor in variants.items():
        ocr.det = predictor
        answers[name] = [ocr(data) for data in datas]
    texts = sum(a["rec_texts"] != b["rec_texts"] for a, b in zip(*answers.values()))
    polys = max((np.abs(np.asarray(a["rec_polys"]) - np.asarray(b["rec_polys"])).max()
                 for a, b in zip(*answers.values()) if a["rec_texts"] == b["rec_texts"] and a["rec_polys"]), default=0)
    scores = max((np.abs(np.asarray(a["rec_scores"]) - np.asarray(b["rec_scores"])).max()
                  for a, b in zip(*answers.values()) if a["rec_texts"] == b["rec_texts"] and a["rec_scores"]), default=0)
    print(f"whole pipeline, {len(datas)} pages: texts differ on {texts}; largest polygon difference {polys} px, "
          f"score difference {scores:.4f}")


if __name__ == "__main__":
    main()
