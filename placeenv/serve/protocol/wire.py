"""Tensors on the wire: JSON number lists and binary buffers to numpy arrays, and back.

Shared by both HTTP APIs and gRPC, with the protocol's datatypes and ``prefix``; no Paddle here.
Every refusal is an ``InvalidInput`` that names the tensor and what was expected, and quotes at
most a short prefix of the input.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import InvalidInput

#: Open Inference Protocol datatype -> numpy dtype, for every datatype the service takes.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),  # byte strings: numpy object arrays of bytes (below)
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
    if kind == "BYTES":
        return bytes_from_json(data, tensor, shape)
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
    """Raw little-endian values (BOOL: one byte each; BYTES: serialized elements), as Triton's binary
    tensor extension sends them."""
    if kind == "BYTES":
        return bytes_from_binary(buffer, tensor, shape)
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
    if array.dtype == object:
        return bytes_to_binary(array)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


# -- BYTES: tensors of byte strings ------------------------------------------------------------
# Numpy object arrays of ``bytes``, as tritonclient sends and reads them (``np.object_``): in JSON
# each element a string (its UTF-8 bytes), in binary (Triton's binary tensor extension, gRPC's
# raw contents) each a 4-byte little-endian length, then its bytes.

#: Elements in one BYTES tensor at most: each is a Python object, and four bytes of length ask
#: for one, so the body limit alone would let a request ask for a quarter of a million a megabyte.
MAX_BYTES_ELEMENTS = 1 << 16
#: Bytes in one element at most.
MAX_BYTES_ELEMENT = 64 << 20
_LENGTH = struct.Struct("<I")


def _bytes_count(tensor: str, shape: tuple[int, ...], given: int | None = None) -> int:
    """The elements of a BYTES tensor of ``shape``, within the limit, and as many as ``given`` (the
    values sent), checked before any element is read."""
    if any(d < 0 for d in shape):
        raise InvalidInput(f"tensor {tensor!r} has shape {prefix(list(shape))}; dimensions are >= 0")
    count = math.prod(shape)
    if count > MAX_BYTES_ELEMENTS:
        raise InvalidInput(f"tensor {tensor!r} (BYTES) has {prefix(count)} elements; at most {MAX_BYTES_ELEMENTS} "
                           "a tensor: send fewer, or longer ones")
    if given is not None and given != count:
        raise InvalidInput(f"tensor {tensor!r}: {given} values for shape {prefix(list(shape))}; send {count}")
    return count


def bytes_from_binary(buffer: memoryview | bytes, tensor: str, shape: tuple[int, ...]) -> np.ndarray:
    """A BYTES tensor of ``shape`` from its serialized elements (a 4-byte little-endian length, then
    the bytes, for each); ``InvalidInput`` naming the element for a length cut short, one past the end
    of the data, or bytes left over. Messages quote no byte of the data."""
    tensor = _label(tensor)
    count = _bytes_count(tensor, shape)
    view, offset, size = memoryview(buffer).cast("B"), 0, len(buffer)
    elements = np.empty(count, dtype=object)
    for i in range(count):
        if offset + 4 > size:
            raise InvalidInput(f"tensor {tensor!r} (BYTES): element {i} of {count} has no 4-byte length ({size - offset} "
                               "bytes left); send each element as a little-endian uint32 length, then its bytes")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if length > MAX_BYTES_ELEMENT:
            raise InvalidInput(f"tensor {tensor!r} (BYTES): element {i} says {length} bytes; at most "
                               f"{MAX_BYTES_ELEMENT} an element")
        if offset + length > size:
            raise InvalidInput(f"tensor {tensor!r} (BYTES): element {i} says {length} bytes, past the end of the "
                               f"data ({size - offset} bytes left)")
        elements[i] = bytes(view[offset:offset + length])
        offset += length
    if offset != size:
        raise InvalidInput(f"tensor {tensor!r} (BYTES): {size - offset} bytes after its {count} elements of shape "
                           f"{prefix(list(shape))}; send exactly one length and its bytes an element")
    return elements.reshape(shape)


def bytes_from_json(data: Any, tensor: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A BYTES tensor from JSON strings (nested, or flat with ``shape``): each element the UTF-8 bytes
    of its string. Anything else (a number, a ragged nesting, a lone surrogate) is an
    ``InvalidInput`` naming the position."""
    name, tensor = tensor, _label(tensor)
    if not isinstance(data, list):
        raise InvalidInput(f"tensor {tensor!r}: data must be a list of strings, got {type(data).__name__}")
    found, level = [len(data)], data  # the nesting's shape, and its values one level down at a time
    while level and all(type(item) is list for item in level) and len(level) <= MAX_BYTES_ELEMENTS:
        width = len(level[0])
        if any(len(item) != width for item in level):
            raise InvalidInput(f"tensor {tensor!r} is ragged: its nested lists differ in length below shape {found}")
        found.append(width)
        if len(found) > _MAX_DEPTH:
            raise InvalidInput(f"tensor {tensor!r} is nested too deep (at most {_MAX_DEPTH} levels)")
        level = list(itertools.chain.from_iterable(level))
    shape = tuple(shape) if shape is not None else tuple(found)
    _bytes_count(tensor, shape, len(level))  # before a string is encoded
    encoded = []
    for i, item in enumerate(level):
        if type(item) is not str:
            what = "a list where the nesting ends" if isinstance(item, list) else prefix(item)
            raise InvalidInput(f"tensor {tensor!r} (BYTES) has {what} at element {i}; expected strings (binary "
                               "data: send it with the binary tensor extension)")
        try:
            encoded.append(item.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidInput(f"tensor {tensor!r} (BYTES): element {i} is not text (a lone surrogate); send "
                               "text, or the bytes with the binary tensor extension") from None
    return bytes_from_elements(encoded, name, shape)


def bytes_from_elements(elements: list, tensor: str, shape: tuple[int, ...]) -> np.ndarray:
    """A BYTES tensor of ``shape`` from its elements as a protocol gives them (gRPC's ``bytes_contents``)."""
    tensor = _label(tensor)
    count = _bytes_count(tensor, shape, len(elements))
    array = np.empty(count, dtype=object)
    for i, element in enumerate(elements):
        if len(element) > MAX_BYTES_ELEMENT:
            raise InvalidInput(f"tensor {tensor!r} (BYTES): element {i} has {len(element)} bytes; at most "
                               f"{MAX_BYTES_ELEMENT} an element")
        array[i] = bytes(element)
    return array.reshape(shape)


def bytes_to_binary(array: np.ndarray) -> bytes:
    """A BYTES tensor serialized: each element's 4-byte little-endian length, then its bytes (a ``str``
    element as its UTF-8)."""
    parts = []
    for element in array.flat:
        data = element.encode("utf-8") if isinstance(element, str) else bytes(element)
        parts += (_LENGTH.pack(len(data)), data)
    return b"".join(parts)


def bytes_to_json(array: np.ndarray) -> list[str]:
    """A BYTES tensor's elements as JSON strings, flat; ``ValueError`` for an element that is not UTF-8
    text (the client asks for it as binary data instead)."""
    return [element if isinstance(element, str) else bytes(element).decode("utf-8") for element in array.flat]
