"""The README's test command, from a fresh clone, on a machine made slower by busy loops: does the
suite pass, and how long does it take?

    python benchmarks/suite_under_load.py [--busy 2] [--runs 3] [--rev HEAD] [--pytest-args "..."]

Each run clones REV of this checkout into a new temporary folder and runs the README's second
command there verbatim (``python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' &&
.venv/bin/python -m pytest``), with ``--busy`` CPU-bound loops (one process each, started first,
killed at the end) beside it: on a 2-core VM, two loops take CPU time from every process of the
suite, a repeatable stand-in for a slower machine (docs/testing.md says how much slower). Runs go
one after another; the machine's system packages (.ci/run's) are taken as installed.

Prints, per run: the exit code, the wall time of the install and of pytest, and pytest's closing
line, and keeps pytest's output in ``--logs``; then a Markdown table for docs/testing.md. Exits
non-zero if any run failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]'"
TESTS = ".venv/bin/python -m pytest"


def spin() -> None:
    while True:
        pass


def run_once(rev: str, busy: int, pytest_args: str, log: Path) -> dict:
    loops = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
    for loop in loops:
        loop.start()
    try:
        with tempfile.TemporaryDirectory(prefix="placeenv-suite-") as tmp:
            clone = Path(tmp) / "placeenv"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
            started = time.monotonic()
            install = subprocess.run(INSTALL, shell=True, cwd=clone, capture_output=True, text=True)
            installed = time.monotonic()
            if install.returncode != 0:
                return {"code": install.returncode, "install_s": installed - started, "pytest_s": 0.0,
                        "summary": "install failed: " + install.stderr[-500:]}
            tests = subprocess.run(f"{TESTS} {pytest_args}", shell=True, cwd=clone, capture_output=True, text=True)
            done = time.monotonic()
            log.write_text(tests.stdout + tests.stderr)
            lines = [line for line in tests.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
            failures = [line for line in tests.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
            return {"code": tests.returncode, "install_s": installed - started, "pytest_s": done - installed,
                    "summary": (lines[-1].strip("= ") if lines else tests.stdout[-500:]),
                    "failures": failures}
    finally:
        for loop in loops:
            loop.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound loops beside the suite")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--pytest-args", default="", help="appended to the README's pytest command")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()),
                        help="where each run's pytest output goes (suite-<rev>-<run>.log)")
    args = parser.parse_args()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    rows = []
    for i in range(args.runs):
        log = args.logs / f"suite-{rev}-{i + 1}.log"
        result = run_once(rev, args.busy, args.pytest_args, log)
        rows.append(result)
        print(f"run {i + 1}: exit {result['code']}, install {result['install_s']:.0f} s, "
              f"pytest {result['pytest_s']:.0f} s: {result['summary']} ({log})", flush=True)
        for line in result.get("failures", []):
            print("   ", line, flush=True)
    print(f"\n{date.today()}, {platform.machine()}, {multiprocessing.cpu_count()} cores, {rev}, "
          f"{args.busy} busy loops{', pytest ' + shlex.quote(args.pytest_args) if args.pytest_args else ''}:\n")
    print("| run | exit | install | pytest | pytest's last line |\n|---|---:|---:|---:|---|")
    for i, row in enumerate(rows, 1):
        print(f"| {i} | {row['code']} | {row['install_s']:.0f} s | {row['pytest_s']:.0f} s "
              f"({row['pytest_s'] / 60:.1f} min) | {row['summary']} |")
    return 0 if all(row["code"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
