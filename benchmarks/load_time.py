"""Start-up to ready on PaddleX's OCR pipeline file, with ``backend: auto`` measuring, against a commit before:

    python benchmarks/load_time.py BEFORE [--rounds 5]

``BEFORE`` is a commit (its tree checked out into a temporary git worktree, run with this venv and
``PYTHONPATH`` on it). Each round starts, in turn: the commit before; this tree with its conversions and
choices kept (``warm``: the second start of a machine); with its conversions kept and its choices removed
(``measured``: ``auto`` measuring each export, as after an upgrade of a package); with an empty conversion
cache (``cold``: the first start, paddle2onnx converting each export). Each is the service on ``--devices cpu`` with the OCR file
(tests/support/ocr_pipeline.yaml and PP-OCRv5's exports), timed from its start to ``/v2/health/ready``.
Prints median (min..max) and the per-round ratios to the commit before, with the date and machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import paddlex_serving as serving  # noqa: E402


def start(tree: Path, repository: Path, tmp: Path, tag: str, env: dict) -> float:
    port = serving.free_port()
    command = [sys.executable, "-m", "placeenv.serve", "--model-repository", str(repository), "--devices", "cpu",
               "--port", str(port), "--host", "127.0.0.1"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}
    base.update({"PLACEENV_LOG_LEVEL": "warning", "PYTHONPATH": str(tree), **env})
    server = serving.Process(tag, command, base, port, "/v2/health/ready", tmp / f"{tag}.log", 300)
    server.stop()
    return server.start_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    found: dict[str, list[float]] = {"before": [], "warm": [], "measured": [], "cold": []}
    with tempfile.TemporaryDirectory(prefix="load-time-") as scratch:
        tmp = Path(scratch)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tmp / "before"), args.before],
                       check=True, capture_output=True)
        try:
            pipeline = serving.reference.pipeline_file(tmp)
            (tmp / "repository" / serving.MODEL).mkdir(parents=True)
            (tmp / "repository" / serving.MODEL / "pipeline.yaml").write_text(pipeline.read_text())
            cache = tmp / "onnx-warm"
            start(ROOT, tmp / "repository", tmp, "fill", {"PLACEENV_ONNX_CACHE": str(cache)})  # the warm cache
            for number in range(args.rounds):
                found["before"].append(start(tmp / "before", tmp / "repository", tmp, "before", {}))
                found["warm"].append(start(ROOT, tmp / "repository", tmp, "warm", {"PLACEENV_ONNX_CACHE": str(cache)}))
                shutil.rmtree(cache / "choices")  # the measured start keeps its choices again
                found["measured"].append(start(ROOT, tmp / "repository", tmp, "measured",
                                               {"PLACEENV_ONNX_CACHE": str(cache)}))
                found["cold"].append(start(ROOT, tmp / "repository", tmp, "cold",
                                           {"PLACEENV_ONNX_CACHE": str(tmp / f"onnx-cold-{number}")}))
                serving.say(f"round {number + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in found.items()))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "before")],
                           capture_output=True)
    print(f"\n{datetime.date.today().isoformat()}, {serving.machine()}; `{shlex.join(['python', *sys.argv])}`\n")
    print("| start-up to ready, s | median (min..max) | / before, per round |")
    print("|---|---:|---:|")
    for name, values in found.items():
        ratios = [v / b for v, b in zip(values, found["before"])]
        print(f"| {name} | {statistics.median(values):.1f} ({min(values):.1f}..{max(values):.1f}) | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
