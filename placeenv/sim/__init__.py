"""Simulated accelerators: N real Paddle devices ``sim:0..N-1`` on a CPU-only machine.

``sim_device.cc`` implements Paddle's CustomDevice runtime C API with host
memory. It is compiled on first use with the system C++ compiler against the
header inside the installed paddle wheel, and cached by content hash. Paddle
loads it at ``import paddle`` from ``CUSTOM_DEVICE_ROOT``, so everything here
must run *before* Paddle is imported::

    import placeenv.sim
    placeenv.sim.prepare(devices=4)
    import paddle                      # now has sim:0 .. sim:3

or, from a shell: ``eval "$(python -m placeenv.sim env --devices 4)"``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["DEVICE_TYPE", "build", "cache_root", "environment", "prepare", "SimSetupError", "user_cache"]

DEVICE_TYPE = "sim"
DEFAULT_DEVICES = 4
MAX_DEVICES = 64
SOURCE = Path(__file__).with_name("sim_device.cc")
LIBRARY_NAME = "libpaddle-custom-sim.so"


class SimSetupError(RuntimeError):
    """The simulated device could not be prepared."""


def _paddle_include() -> Path:
    # find_spec on a top-level package does not import it.
    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.submodule_search_locations:
        raise SimSetupError(
            f"this Python ({sys.executable}, {sys.version.split()[0]}) has no paddle: run this with the "
            f"Python that has Paddle and placeenv installed (a virtualenv's, e.g. .venv/bin/python), "
            f"or install Paddle into this one: "
            f"{shlex.quote(sys.executable)} -m pip install 'paddlepaddle==3.3.*'"
        )
    include = Path(list(spec.submodule_search_locations)[0]) / "include"
    if not (include / "paddle/phi/backends/device_ext.h").is_file():
        raise SimSetupError(f"the paddle wheel has no CustomDevice header under {include}")
    return include


def user_cache() -> Path:
    """placeenv's per-user cache: ``$XDG_CACHE_HOME/placeenv``, or ``~/.cache/placeenv``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "placeenv"


def cache_root() -> Path:
    """Where built plugins are kept: ``$PLACEENV_SIM_CACHE``, else ``sim`` in :func:`user_cache`."""
    if os.environ.get("PLACEENV_SIM_CACHE"):
        return Path(os.environ["PLACEENV_SIM_CACHE"])
    return user_cache() / "sim"


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    raise SimSetupError("no C++ compiler found (set CXX, or install g++)")


def build(force: bool = False) -> Path:
    """Compile the plugin if needed; returns the directory to use as CUSTOM_DEVICE_ROOT."""
    include = _paddle_include()
    header = (include / "paddle/phi/backends/device_ext.h").read_bytes()
    digest = hashlib.sha256(SOURCE.read_bytes() + header).hexdigest()[:16]
    directory = cache_root() / digest
    library = directory / LIBRARY_NAME
    if library.is_file() and not force:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent builders never see half a file,
    # and the directory never holds anything but the finished plugin.
    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        partial = Path(tmp) / LIBRARY_NAME
        command = [
            _compiler(), "-std=c++17", "-O2", "-fPIC", "-shared",
            f"-I{include}", str(SOURCE), "-o", str(partial),
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise SimSetupError(
                f"compiling the sim plugin failed:\n$ {shlex.join(command)}\n{result.stderr[-4000:]}"
            )
        os.replace(partial, library)
    return directory


def environment(devices: int = DEFAULT_DEVICES) -> dict[str, str]:
    """The variables Paddle needs to load ``devices`` sim devices (builds the plugin)."""
    if not 1 <= int(devices) <= MAX_DEVICES:
        raise SimSetupError(f"devices must be between 1 and {MAX_DEVICES}, got {devices}")
    return {
        "CUSTOM_DEVICE_ROOT": str(build()),
        "PLACEENV_SIM_DEVICES": str(int(devices)),
        # Views (x.T, x[:, 1]) need contiguous kernels: CPU fallback has no stride kernels.
        "FLAGS_use_stride_kernel": "0",
        "GLOG_minloglevel": os.environ.get("GLOG_minloglevel", "2"),
    }


def prepare(devices: int = DEFAULT_DEVICES) -> dict[str, str]:
    """Set ``os.environ`` so that the next ``import paddle`` has ``sim:0..devices-1``."""
    if "paddle" in sys.modules:
        raise SimSetupError(
            "placeenv.sim.prepare() must run before `import paddle`: Paddle loads device "
            "plugins only at import. Call it first, or start the process with the variables "
            "from `python -m placeenv.sim env`."
        )
    env = environment(devices)
    os.environ.update(env)
    return env
