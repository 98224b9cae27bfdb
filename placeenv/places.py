"""Turning what users write ('gpu:1', 3, CustomPlace('npu', 0), ...) into Paddle places."""

from __future__ import annotations

import re

from . import _internals as _pd
from .sim import DEVICE_TYPE as SIM

__all__ = ["available_devices", "device_name", "to_place"]

_DEVICE_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::\s*(\d{1,9}))?\s*$")
_MAX_INDEX = 10**9


def _count(kind: str) -> int:
    try:
        if kind == "gpu":
            return _pd.cuda_device_count() if _pd.is_compiled_with_cuda() else 0
        if kind == "xpu":
            return _pd.xpu_device_count() if _pd.is_compiled_with_xpu() else 0
        return _pd.custom_device_count(kind)
    except Exception:  # a driver that fails to answer has no usable device
        return 0


def _accelerator_kinds() -> list[str]:
    kinds = ["gpu", "xpu"]
    kinds += sorted(_pd.custom_device_types() or [])
    return [k for k in kinds if _count(k) > 0]


def available_devices() -> list[str]:
    """Every device this process can use, e.g. ``['cpu', 'gpu:0', 'sim:0', 'sim:1']``."""
    names = ["cpu"]
    for kind in _accelerator_kinds():
        names += [f"{kind}:{i}" for i in range(_count(kind))]
    return names


_NAMES: dict = {}  # place -> name; bounded by the devices a process has


def device_name(place) -> str:
    """``'cpu'``, ``'gpu:0'``, ``'sim:1'``: the same names ``paddle.device.get_device()`` uses."""
    try:
        return _NAMES[place]  # one hash instead of up to six calls into Paddle; hot on request paths
    except (KeyError, TypeError):
        pass
    name = _name(place)
    if len(_NAMES) < 1024:
        try:
            key = _pd.Place()
            key.set_place(place)  # a copy: the caller's object stays free to change
            _NAMES[key] = name
        except (TypeError, ValueError, RuntimeError):
            pass
    return name


def _name(place) -> str:
    if place.is_cpu_place():
        return "cpu"
    if place.is_gpu_place():
        return f"gpu:{place.gpu_device_id()}"
    if place.is_xpu_place():
        return f"xpu:{place.xpu_device_id()}"
    if place.is_custom_place():
        return f"{place.custom_device_type()}:{place.custom_device_id()}"
    if place.is_cuda_pinned_place():
        return "gpu_pinned"
    return str(place)


def _unknown(device, why: str = "") -> ValueError:
    if isinstance(device, int) and not -_MAX_INDEX < device < _MAX_INDEX:
        shown = "an index out of range"  # repr() of a huge int can itself raise
    else:
        shown = repr(device) if not isinstance(device, str) or len(device) <= 80 else repr(device[:80] + "...")
    return ValueError(
        f"unknown device {shown}{': ' + why if why else ''}; "
        f"available devices: {', '.join(available_devices())}"
    )


def _load_hint(kind: str) -> str:
    if kind != SIM:
        return ""
    return (
        f" ({SIM!r} is placeenv's simulated device, and this process has not loaded it: call "
        f"placeenv.sim.prepare(devices=N) before the first `import paddle`, or start Python with "
        f"the variables from `eval \"$(python -m placeenv.sim env --devices N)\"`)"
    )


def explain_device(device, error: ValueError) -> None:
    """Raise a clearer error for a device ``paddle.set_device`` refused, when there is more to say."""
    match = _DEVICE_RE.match(device) if isinstance(device, str) else None
    if match is not None:
        kind = match.group(1)
        if kind == SIM and _count(SIM) == 0:
            raise ValueError(f"{error}{_load_hint(kind)}") from error


_CANONICAL: dict[str, object] = {}


def canonical(place):
    """One shared, concrete place object per device, so hot paths can compare and key by identity."""
    name = device_name(place)
    shared = _CANONICAL.get(name)
    if shared is None:
        shared = _CANONICAL[name] = normalize(place)
    return shared


def _make(kind: str, index: int | None, original):
    return canonical(_build(kind, index, original))


def _build(kind: str, index: int | None, original):
    if kind == "cpu":
        if index not in (None, 0):
            raise _unknown(original, "cpu takes no index")
        return _pd.CPUPlace()
    if kind in ("cuda", "dcu"):
        kind = "gpu"
    count = _count(kind)
    if count == 0:
        known = kind in ("gpu", "xpu") or kind in (_pd.custom_device_types() or [])
        why = f"no {kind} device in this process" if known else f"no device type {kind!r}"
        raise _unknown(original, why + _load_hint(kind))
    index = 0 if index is None else index
    if not 0 <= index < count:
        raise _unknown(original, f"{kind} has {count} device(s)")
    if kind == "gpu":
        return _pd.CUDAPlace(index)
    if kind == "xpu":
        return _pd.XPUPlace(index)
    return _pd.CustomPlace(kind, index)


def normalize(place):
    """A generic ``core.Place`` (what ``tensor.place`` returns) as its concrete type.

    Paddle treats a generic ``core.Place`` stored as the expected place as "not
    set yet", so concrete places must be stored.
    """
    if type(place) is not _pd.Place:
        return place
    if place.is_cpu_place():
        return _pd.CPUPlace()
    if place.is_gpu_place():
        return _pd.CUDAPlace(place.gpu_device_id())
    if place.is_xpu_place():
        return _pd.XPUPlace(place.xpu_device_id())
    if place.is_custom_place():
        return _pd.CustomPlace(place.custom_device_type(), place.custom_device_id())
    if place.is_cuda_pinned_place():
        return _pd.CUDAPinnedPlace()
    return place


def to_place(device):
    """Validate ``device`` and return a concrete Paddle place.

    Accepts ``'cpu'``, ``'gpu'``, ``'gpu:N'``, ``'cuda:N'``, ``'xpu:N'``,
    ``'<custom_type>:N'``, an ``int`` N (the N-th device of the first
    accelerator type present), and place objects. Raises ``ValueError`` naming
    the available devices.
    """
    place_types = (_pd.Place, _pd.CPUPlace, _pd.CUDAPlace, _pd.XPUPlace, _pd.CustomPlace, _pd.CUDAPinnedPlace)
    if isinstance(device, place_types):
        place = normalize(device)
        if place.is_cpu_place() or place.is_cuda_pinned_place():
            return canonical(place)
        return _make(*_split(device_name(place)), device)
    if isinstance(device, bool):
        raise _unknown(device, "expected a device name, index or place")
    if isinstance(device, int):
        kinds = _accelerator_kinds()
        if not kinds:
            raise _unknown(device, "no accelerator in this process")
        return _make(kinds[0], device, device)
    if isinstance(device, str):
        kind, index = _split(device, original=device)
        return _make(kind, index, device)
    raise _unknown(device, f"expected str, int or a Paddle place, got {type(device).__name__}")


def _split(text: str, original=None):
    match = _DEVICE_RE.match(text)
    if match is None:
        raise _unknown(original if original is not None else text, "expected 'type' or 'type:index'")
    kind = match.group(1).lower()
    if kind not in ("cpu", "gpu", "cuda", "dcu", "xpu"):
        kind = match.group(1)  # custom device types are case-sensitive
    index = match.group(2)
    return kind, None if index is None else int(index)
