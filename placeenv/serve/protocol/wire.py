"""Tensors on the wire: JSON number lists and binary buffers to numpy arrays, and back.

Shared by both HTTP APIs and gRPC, with the protocol's datatypes and ``prefix``; no Paddle here.
Every refusal is an ``InvalidInput`` that names the tensor and what was expected, and quotes at
most a short prefix of the input.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import InvalidInput

#: Open Inference Protocol datatype -> numpy dtype, for every datatype the service takes.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
_BY_NUMPY = {dtype: name for name, dtype in DATATYPES.items()}

_INTEGER = frozenset({"UINT8", "INT8", "INT16", "INT32", "INT64"})
_LEAVES = {"BOOL": {bool}, **{t: {int} for t in _INTEGER}, "FP16": {int, float}, "FP32": {int, float},
           "FP64": {int, float}}
_MAX_DEPTH = 8


def datatype_of(dtype: Any) -> str:
    """The protocol datatype of a numpy or Paddle dtype ('FP32' for float32 / paddle.float32)."""
    name = str(dtype).removeprefix("paddle.")
    try:
        return _BY_NUMPY[np.dtype(name)]
    except (TypeError, KeyError):
        raise ValueError(f"dtype {dtype} has no Open Inference Protocol datatype the service takes "
                         f"({', '.join(DATATYPES)})") from None


def prefix(value: Any, limit: int = 40) -> str:
    """``repr`` of a client-sent value, cut to ``limit`` characters: error messages never echo more."""
    try:
        text = repr(value)
    except ValueError:  # an int of over 4300 digits (sys.get_int_max_str_digits), alone or inside a list
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _label(tensor: str) -> str:
    """A client-sent tensor name as messages quote it: at most a short prefix."""
    return tensor if len(tensor) <= 40 else f"{tensor[:40]}... ({len(tensor)} characters)"


def datatype(name: Any, tensor: str, expected: str | None = None) -> np.dtype:
    """The dtype of datatype ``name``; refused when it is not the ``expected`` one (the model's), before
    any data is read as ``name``: the answer then names both, not a value that does not fit."""
    dtype = DATATYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise InvalidInput(f"tensor {tensor!r} has datatype {prefix(name)}; the service takes "
                           f"{', '.join(DATATYPES)}")
    if expected is not None and name != expected:
        raise InvalidInput(f"input {tensor!r} has datatype {name}; expected {expected}, the model's datatype "
                           f"for it: send the data as {expected}")
    return dtype


def check_input(read: Mapping[str, Any], tensor: str, kind: Any, expected: Mapping[str, str]) -> None:
    """Before an input's data is read: refuse a name already in ``read`` (the inputs read so far), or a
    datatype other than ``expected[tensor]``, the model's (messages quote a prefix of the name)."""
    if tensor in read:
        raise InvalidInput(f"input {prefix(tensor)} appears twice; send each input once")
    datatype(kind, _label(tensor), expected.get(tensor))


def media_type(content_type: str | bytes) -> str:
    """A Content-Type header's media type, without parameters: ``'application/json'``."""
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    return content_type.partition(";")[0].strip().lower()


def is_json(content_type: str | bytes | None) -> bool:
    """Whether a Content-Type header is JSON's, as FastAPI decides to read a body as JSON."""
    if content_type is None:
        return False
    kind = media_type(content_type)
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def sent_type(content_type: str | None) -> str:
    """The Content-Type a request had, as a refusal quotes it (a prefix)."""
    return "no Content-Type" if content_type is None else f"Content-Type: {prefix(content_type)}"


def outline(data: Any) -> tuple[list[int], Any]:
    """The lengths of ``data``'s nested lists down its first elements, and the value found there:
    ``[[1, 2], [3, 4]]`` is ``([2, 2], 1)``; the shape of regular data, without walking all of it."""
    lengths = []
    while isinstance(data, list) and data:
        lengths.append(len(data))
        data = data[0]
    return lengths, data


def from_json(data: Any, kind: str, tensor: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``data`` (nested lists of numbers) as an array of ``kind``, reshaped to ``shape`` when given.

    Without ``shape`` the nesting gives the shape; with it, ``data`` may be flat or
    nested, and must hold exactly the shape's number of values.
    """
    tensor = _label(tensor)
    dtype = datatype(kind, tensor)
    if not isinstance(data, list):
        raise InvalidInput(f"tensor {tensor!r}: data must be a list of values, got {type(data).__name__}")
    array = fast_array(data, kind, dtype)
    if array is None:
        array = checked_array(data, kind, dtype, tensor)
    if shape is not None:
        if any(d < 0 for d in shape):
            raise InvalidInput(f"tensor {tensor!r} has shape {prefix(list(shape))}; dimensions are >= 0")
        if array.size != math.prod(shape):
            raise InvalidInput(f"tensor {tensor!r}: {array.size} values for shape {prefix(list(shape))}; "
                               f"send {prefix(math.prod(shape))}")
        array = _reshaped(array, shape, tensor)
    return array


def fast_array(data: list, kind: str, dtype: np.dtype) -> np.ndarray | None:
    """The common case, checked by C loops: regular nesting of the right leaf type; else None."""
    try:
        # Integers are probed as float64, to see their range before the cast; the rest are made
        # in their own dtype at once (a float beyond it is inf, as a cast would make it).
        with np.errstate(over="ignore"):
            probe = np.asarray(data, dtype=np.float64 if kind in _INTEGER else dtype)
    except (ValueError, TypeError, OverflowError):
        return None
    if probe.ndim > _MAX_DEPTH:
        return None
    leaves = data
    for _ in range(probe.ndim - 1):
        if any(type(row) is not list for row in leaves):
            return None
        leaves = list(itertools.chain.from_iterable(leaves))
    if not set(map(type, leaves)) <= _LEAVES[kind]:
        return None
    if kind in _INTEGER:
        try:
            return np.asarray(data, dtype=dtype) if _ints_fit(probe, dtype) else None
        except (OverflowError, ValueError):
            return None
    return probe


def _ints_fit(probe: np.ndarray, dtype: np.dtype) -> bool:
    info = np.iinfo(dtype)
    return not probe.size or (info.min <= probe.min() and probe.max() <= info.max)


def checked_array(data: list, kind: str, dtype: np.dtype, tensor: str) -> np.ndarray:
    """The slow path, for anything unusual: walks the values to name the exact problem."""
    allowed = _LEAVES[kind]
    what = {"BOOL": "true/false", "FP16": "numbers", "FP32": "numbers", "FP64": "numbers"}.get(kind, "integers")
    try:
        cells = np.array(data, dtype=object)  # keeps every leaf as sent
    except Exception as exc:  # noqa: BLE001 - any numpy failure on hostile input is the client's
        raise InvalidInput(f"tensor {tensor!r} is not an array of {what} ({type(exc).__name__})") from None
    if cells.ndim > _MAX_DEPTH:
        raise InvalidInput(f"tensor {tensor!r} is nested too deep ({cells.ndim}+ levels; at most {_MAX_DEPTH})")
    for flat, cell in enumerate(cells.flat):
        if type(cell) in allowed:
            continue
        if isinstance(cell, (list, tuple)):
            raise InvalidInput(f"tensor {tensor!r} is ragged: its nested lists differ in length or depth "
                               f"below shape {list(cells.shape)}")
        at = f" at position {[int(i) for i in np.unravel_index(flat, cells.shape)]}" if cells.ndim else ""
        raise InvalidInput(f"tensor {tensor!r} ({kind}) has the value {prefix(cell)}{at}; expected {what}")
    if kind in _INTEGER:
        info = np.iinfo(dtype)
        for flat, cell in enumerate(cells.flat):
            if not info.min <= cell <= info.max:
                at = [int(i) for i in np.unravel_index(flat, cells.shape)]
                raise InvalidInput(f"tensor {tensor!r} has {prefix(cell)} at position {at}, outside {kind}'s "
                                   f"range [{info.min}, {info.max}]")
    try:
        with np.errstate(over="ignore"):
            return cells.astype(np.float64 if kind not in _INTEGER and kind != "BOOL" else dtype).astype(dtype)
    except OverflowError:
        raise InvalidInput(f"tensor {tensor!r} has an integer too large for {kind}") from None


def from_binary(buffer: memoryview | bytes, kind: str, tensor: str, shape: tuple[int, ...]) -> np.ndarray:
    """Raw little-endian values (BOOL: one byte each), as Triton's binary tensor extension sends them."""
    tensor = _label(tensor)
    dtype = datatype(kind, tensor).newbyteorder("<")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"tensor {tensor!r} has shape {prefix(list(shape))}; dimensions are >= 0")
    want = math.prod(shape) * dtype.itemsize
    if len(buffer) != want:
        raise InvalidInput(f"tensor {tensor!r}: {len(buffer)} bytes of binary data for {kind} "
                           f"{prefix(list(shape))}; send {prefix(want)}")
    array = _reshaped(np.frombuffer(buffer, dtype=dtype), shape, tensor)
    if kind == "BOOL" and array.size and array.view(np.uint8).max() > 1:
        raise InvalidInput(f"tensor {tensor!r} (BOOL) has bytes other than 0 and 1")
    return array.astype(dtype.newbyteorder("="), copy=False)


def _reshaped(array: np.ndarray, shape: tuple[int, ...], tensor: str) -> np.ndarray:
    try:
        return array.reshape(shape)
    except ValueError:  # over numpy's 64 dimensions, or a dimension past its index range beside a 0
        raise InvalidInput(f"tensor {tensor!r} has shape {prefix(list(shape))}, which numpy cannot hold "
                           "(at most 64 dimensions, each below 2**63)") from None


def to_binary(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
