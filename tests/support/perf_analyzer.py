"""Triton's perf_analyzer, as the tritonclient 2.40.0 wheel ships it, for the e2e test and the benchmark.

Later tritonclient wheels no longer carry the binary (and the venv keeps its newer tritonclient), so
``binary()`` downloads the 2.40.0 manylinux x86_64 wheel once with pip, unpacks only
``tritonclient-2.40.0.data/data/bin/perf_analyzer`` into a cache directory and makes it executable.
It links to two libraries the wheel does not hold: ``libb64.so.0d`` (Debian's ``libb64-0d``; .ci/run
installs it) and ``libcudart.so.12`` (the ``nvidia-cuda-runtime-cu12`` wheel, in the ``dev`` extra);
``environment()`` puts the latter on ``LD_LIBRARY_PATH``. Each missing part is an error that names
what to install, never a silent skip; only a machine that is not x86_64 has no such binary.
"""

from __future__ import annotations

import csv
import ctypes.util
import importlib.util
import os
import platform
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "2.40.0"
MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"


class Unavailable(RuntimeError):
    """perf_analyzer cannot be had here; the message says what to install."""


def supported() -> str | None:
    """Why this machine cannot run the wheel's binary, or None when it can."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"perf_analyzer {VERSION} is built for Linux x86_64 only (this is {sys.platform} {platform.machine()})"
    return None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "placeenv" / f"perf_analyzer-{VERSION}"


def binary() -> Path:
    """The perf_analyzer executable, fetched into ``cache_dir()`` on first use."""
    why = supported()
    if why:
        raise Unavailable(why)
    target = cache_dir() / "perf_analyzer"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", f"tritonclient=={VERSION}", "--no-deps",
             "--only-binary=:all:", "--platform", "manylinux1_x86_64", "--dest", scratch, "--quiet"],
            capture_output=True, text=True, timeout=600)
        wheels = list(Path(scratch).glob(f"tritonclient-{VERSION}-*.whl"))
        if fetched.returncode != 0 or not wheels:
            raise Unavailable(f"pip could not download the tritonclient {VERSION} wheel (perf_analyzer is in it): "
                              f"{(fetched.stderr or fetched.stdout).strip()[-800:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            unpacked = Path(wheel.extract(MEMBER, scratch))
        unpacked.chmod(0o755)
        os.replace(unpacked, target)  # whole or absent, for a concurrent caller
    return target


def cuda_runtime() -> Path:
    """The directory of ``libcudart.so.12`` from the nvidia-cuda-runtime-cu12 wheel."""
    spec = importlib.util.find_spec("nvidia.cuda_runtime") if importlib.util.find_spec("nvidia") else None
    found = [Path(p) / "lib" for p in (spec.submodule_search_locations or [])] if spec else []
    found = [d for d in found if (d / "libcudart.so.12").exists()]
    if not found:
        raise Unavailable("perf_analyzer needs libcudart.so.12: pip install nvidia-cuda-runtime-cu12 "
                          "(in the dev extra: pip install -e '.[dev]')")
    return found[0]


def environment() -> dict[str, str]:
    """This process's environment, with what perf_analyzer links to on ``LD_LIBRARY_PATH``."""
    if ctypes.util.find_library("b64") is None:
        raise Unavailable("perf_analyzer needs libb64.so.0d: apt-get install libb64-0d (.ci/run installs it)")
    paths = [str(cuda_runtime()), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(paths)}


def run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """perf_analyzer with ``args``; its output (stdout and stderr together) in ``.stdout``."""
    return subprocess.run([str(binary()), *args], env=environment(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


#: What perf_analyzer prints of the server for each concurrency, read from the server's statistics
#: over the measurement windows: counts, and the average request's microseconds.
SERVER = re.compile(
    r"Server:\s+Inference count: (?P<inference_count>\d+)\s+Execution count: (?P<execution_count>\d+)\s+"
    r"Successful request count: (?P<success_count>\d+)\s+Avg request latency: (?P<latency_us>\d+) usec "
    r"\(overhead (?P<overhead_us>\d+) usec \+ queue (?P<queue_us>\d+) usec \+ compute input (?P<compute_input_us>\d+) "
    r"usec \+ compute infer (?P<compute_infer_us>\d+) usec \+ compute output (?P<compute_output_us>\d+) usec\)")
CLIENT = re.compile(r"Client:\s+Request count: (?P<request_count>\d+)\s+Throughput: (?P<throughput>[\d.]+) infer/sec")


def report(output: str) -> dict[int, dict[str, float]]:
    """Per concurrency, the client's request count and throughput and the server's figures, from
    perf_analyzer's printed report (the server's are absent when it could not read statistics)."""
    found = {}
    for block in re.split(r"^Request concurrency: ", output, flags=re.M)[1:]:
        concurrency = int(block.split(None, 1)[0])
        figures = {}
        for pattern in (CLIENT, SERVER):
            match = pattern.search(block)
            if match:
                figures.update({k: float(v) if "." in v else int(v) for k, v in match.groupdict().items()})
        found[concurrency] = figures
    return found


def rows(csv_file: Path) -> dict[int, dict[str, float]]:
    """Per concurrency, the CSV ``-f`` writes (throughput, latency percentiles and the server's stages, in µs)."""
    with open(csv_file, newline="") as f:
        return {int(row["Concurrency"]): {k: float(v) for k, v in row.items()} for row in csv.DictReader(f)}
