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

Device time is off by default: every transfer is instant. ``transfer_us`` and ``gbps``
(``PLACEENV_SIM_TRANSFER_US``, ``PLACEENV_SIM_GBPS``) give each transfer a device time that the
host waits for inside Paddle's own calls; docs/library.md, "Device time on sim devices", says
what that models and what it does not. :func:`stats` reads a device's counters.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.util
import os
import shlex
import sys
from pathlib import Path

from .. import cbuild

__all__ = ["DEVICE_TYPE", "DeviceStats", "build", "cache_root", "environment", "prepare", "SimSetupError", "stats",
           "user_cache"]

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
    return cbuild.user_cache()


def cache_root() -> Path:
    """Where built plugins are kept: ``$PLACEENV_SIM_CACHE``, else ``sim`` in :func:`user_cache`."""
    return cbuild.cache_root("PLACEENV_SIM_CACHE", "sim")


def build(force: bool = False) -> Path:
    """Compile the plugin if needed; returns the directory to use as CUSTOM_DEVICE_ROOT."""
    include = _paddle_include()
    header = (include / "paddle/phi/backends/device_ext.h").read_bytes()
    try:
        return cbuild.shared_library(SOURCE, LIBRARY_NAME, cache_root(), (f"-I{include}",), salt=header,
                                     force=force, what="the sim plugin").parent
    except cbuild.BuildError as error:
        raise SimSetupError(str(error)) from None


#: Device time: the fixed term of every transfer (µs) and the bandwidth of the per-byte term (GB/s).
TIME_SETTINGS = ("PLACEENV_SIM_TRANSFER_US", "PLACEENV_SIM_GBPS")


def _time_settings(transfer_us: int | None, gbps: float | None) -> dict[str, str]:
    """The device-time variables: the arguments, else the environment's, else off."""
    values = {}
    for name, value in zip(TIME_SETTINGS, (transfer_us, gbps)):
        text = str(value) if value is not None else os.environ.get(name, "0")
        try:
            number = int(text) if name.endswith("_US") else float(text)
        except ValueError:
            number = -1
        if not (0 <= number < 10**9 and (number == 0 or number >= 1e-6)):
            raise SimSetupError(f"{name} is a number of {'µs' if name.endswith('_US') else 'GB/s'}, "
                                f"0 (off) or from 1e-6 to 1e9, got {text[:40]!r}")
        values[name] = str(number)
    return values


def environment(devices: int = DEFAULT_DEVICES, transfer_us: int | None = None,
                gbps: float | None = None) -> dict[str, str]:
    """The variables Paddle needs to load ``devices`` sim devices (builds the plugin), with their
    device time: ``transfer_us`` and ``gbps``, or the environment's, or none."""
    if not 1 <= int(devices) <= MAX_DEVICES:
        raise SimSetupError(f"devices must be between 1 and {MAX_DEVICES}, got {devices}")
    return {
        "CUSTOM_DEVICE_ROOT": str(build()),
        "PLACEENV_SIM_DEVICES": str(int(devices)),
        **_time_settings(transfer_us, gbps),
        # Views (x.T, x[:, 1]) need contiguous kernels: CPU fallback has no stride kernels.
        "FLAGS_use_stride_kernel": "0",
        "GLOG_minloglevel": os.environ.get("GLOG_minloglevel", "2"),
    }


def prepare(devices: int = DEFAULT_DEVICES, transfer_us: int | None = None,
            gbps: float | None = None) -> dict[str, str]:
    """Set ``os.environ`` so that the next ``import paddle`` has ``sim:0..devices-1``."""
    if "paddle" in sys.modules:
        raise SimSetupError(
            "placeenv.sim.prepare() must run before `import paddle`: Paddle loads device "
            "plugins only at import. Call it first, or start the process with the variables "
            "from `python -m placeenv.sim env`."
        )
    env = environment(devices, transfer_us, gbps)
    os.environ.update(env)
    return env


@functools.cache
def _stats_function(root: str):
    """The loaded plugin's ``placeenv_sim_stats``: RTLD_NOLOAD finds the copy Paddle loaded from ``root``
    and never loads a second, empty one."""
    try:
        library = ctypes.CDLL(str(Path(root) / LIBRARY_NAME), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        raise SimSetupError("no sim plugin is loaded in this process: call prepare() before "
                            "`import paddle`") from None
    function = library.placeenv_sim_stats
    function.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
    return function


@dataclasses.dataclass(frozen=True)
class DeviceStats:
    """One sim device's counters since Paddle loaded the plugin."""

    transfers: int  # copies into, out of or within its memory
    bytes: int
    device_seconds: float  # device time charged for them
    waits: int  # host waits that found the device busy
    wait_seconds: float
    memory_used: int  # bytes its allocator holds from the plugin
    uploads: int = 0  # of the transfers, copies from the host into its memory
    downloads: int = 0  # and from its memory to the host (the rest stay on devices)


def stats(device: int) -> DeviceStats:
    """The counters of ``sim:<device>``, from the plugin this process loaded (after ``import paddle``)."""
    function = _stats_function(os.environ.get("CUSTOM_DEVICE_ROOT", ""))
    values = (ctypes.c_uint64 * 8)()
    if function(int(device), values) != 0:
        raise SimSetupError(f"there is no sim:{device} in this process")
    transfers, size, device_ns, waits, wait_ns, used, uploads, downloads = values
    return DeviceStats(transfers, size, device_ns / 1e9, waits, wait_ns / 1e9, used, uploads, downloads)
