"""The model contract (Triton-python-backend-like) and the input validation every model shares.

Lifecycle per worker thread: ``initialize(place)`` once, then for each request
``preprocess`` (on CPU, any thread) -> move to the worker's device ->
``execute`` -> ``postprocess``; ``finalize`` on shutdown.
"""

from __future__ import annotations

import abc
import itertools
import math
import reprlib
from typing import Any, ClassVar

import numpy as np
import paddle

import placeenv
from placeenv import PlaceEnv, device_name
from placeenv import _internals as _pd

__all__ = ["InputError", "Model", "host_tensor", "move_to"]

_NUMBER_TYPES = {int, float}
_HOST = paddle.CPUPlace()


class InputError(ValueError):
    """A request's inputs are invalid; the message says what and where, for the client."""


class Model(abc.ABC):
    """One replica of a model, bound to one Paddle place by ``initialize``."""

    name: ClassVar[str]
    description: ClassVar[str]
    input_shape: ClassVar[tuple[int, ...]]  # per example; what ``preprocess`` produces
    accepted_shapes: ClassVar[tuple[tuple[int, ...], ...]]  # per example, as clients may send it
    value_range: ClassVar[tuple[float, float]]  # inclusive bounds on every input value
    output: ClassVar[str]

    def __init__(self) -> None:
        self.network: paddle.nn.Layer | None = None
        self.place = None
        self._env: PlaceEnv | None = None  # PlaceEnv(place), made once: it keeps no state, so reuse is safe

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """JSON-able summary for clients."""
        return {
            "name": cls.name,
            "description": cls.description,
            "input_shape": list(cls.input_shape),
            "accepted_shapes": [list(s) for s in cls.accepted_shapes],
            "value_range": [float(v) for v in cls.value_range],
            "output": cls.output,
        }

    def initialize(self, place, strict: bool = True) -> dict[str, str]:
        """Build this replica's network with its weights on ``place``, in eval mode.

        Returns ``{weight name: device}`` for weights that landed elsewhere; with
        ``strict`` (the default) any such weight is an error instead.
        """
        place = placeenv.to_place(place)
        with PlaceEnv(place):
            network = self.build()
        network.eval()
        want = device_name(place)
        # state_dict covers buffers too (BatchNorm statistics), not just parameters.
        found = {k: device_name(v.place) for k, v in network.state_dict().items()}
        stray = {k: d for k, d in found.items() if d != want}
        if stray and strict:
            raise RuntimeError(f"{self.name}: weights not on {want}: {stray}")
        self.network, self.place, self._env = network, place, PlaceEnv(place)
        return stray

    @abc.abstractmethod
    def build(self) -> paddle.nn.Layer:
        """Create the network and load its weights; runs under ``PlaceEnv(place)``."""

    @PlaceEnv("cpu")
    def preprocess(self, inputs: Any) -> paddle.Tensor:
        """Validated, normalised CPU tensor of shape ``[batch, *input_shape]``; raises ``InputError``."""
        return host_tensor(self.normalise(self.validate(inputs)))

    def validate(self, inputs: Any) -> np.ndarray:
        """float32 array ``[batch, *input_shape]`` from JSON-decoded inputs, or ``InputError``."""
        if not isinstance(inputs, list):
            raise InputError(f"inputs must be a list of examples, got {type(inputs).__name__}")
        if not inputs:
            raise InputError("inputs is empty: send at least one example")
        if len(inputs) == 1:  # the common case: a view, no copy
            return self._example(0, inputs[0])[np.newaxis]
        return np.stack([self._example(i, example) for i, example in enumerate(inputs)])

    def normalise(self, batch: np.ndarray) -> np.ndarray:
        """Map validated values to what the network expects (identity unless overridden)."""
        return batch

    def _example(self, index: int, example: Any) -> np.ndarray:
        values = self._well_formed(example)
        if values is not None:
            self._check_values(f"example {index}", values)
            return values.astype(np.float32).reshape(self.input_shape)
        return self._diagnose(index, example)

    def _well_formed(self, example: Any) -> np.ndarray | None:
        """The common case, checked by C loops: nested lists of int/float in an accepted shape; else None."""
        if type(example) is not list:
            return None
        try:
            values = np.asarray(example, dtype=np.float64)  # ragged or huge raises; "1" and True convert...
        except (ValueError, TypeError, OverflowError):
            return None
        if values.shape not in self.accepted_shapes:
            return None
        leaves = example
        for _ in range(values.ndim - 1):
            if any(type(row) is not list for row in leaves):
                return None
            leaves = list(itertools.chain.from_iterable(leaves))
        # ...so every leaf must be a real int or float (bool, a subclass of int, is refused on purpose).
        return values if set(map(type, leaves)) <= _NUMBER_TYPES else None

    def _diagnose(self, index: int, example: Any) -> np.ndarray:
        """The slow path, for anything unusual: validates cell by cell to name the exact problem."""
        where = f"example {index}"
        expected = " or ".join(str(s) for s in self.accepted_shapes)
        try:
            # dtype=object keeps every leaf as sent, so each problem can be named precisely.
            cells = np.array(example, dtype=object)
        except Exception as exc:  # noqa: BLE001 - any numpy failure on hostile input is the client's
            raise InputError(f"{where} is not an array of numbers ({type(exc).__name__}: {exc})") from None
        if cells.ndim > max(len(s) for s in self.accepted_shapes):
            raise InputError(f"{where} is nested too deep ({cells.ndim}+ levels); expected shape {expected}")
        if cells.size > max(math.prod(s) for s in self.accepted_shapes):  # before the per-value scan
            raise InputError(f"{where} has shape {cells.shape}; expected shape {expected}")
        for flat, cell in enumerate(cells.flat):
            if type(cell) in (int, float):  # bool is a subclass of int, excluded on purpose
                continue
            if isinstance(cell, (list, tuple)):
                raise InputError(
                    f"{where} is ragged: its nested lists differ in length or depth below shape "
                    f"{cells.shape}; expected shape {expected}"
                )
            at = f" at position {_position(flat, cells.shape)}" if cells.ndim else ""
            raise InputError(f"{where} has a non-numeric value {reprlib.repr(cell)}{at}")
        if cells.shape not in self.accepted_shapes:
            got = "is a single number" if cells.ndim == 0 else f"has shape {cells.shape}"
            raise InputError(f"{where} {got}; expected shape {expected} (inputs is a list of examples)")
        try:
            values = cells.astype(np.float64)
        except OverflowError:
            raise InputError(f"{where} has an integer too large for a float") from None
        self._check_values(where, values)
        return values.astype(np.float32).reshape(self.input_shape)

    def _check_values(self, where: str, values: np.ndarray) -> None:
        low, high = self.value_range
        if values.size:  # the fast check; anything it refuses is looked at in detail below
            least, most = values.min(), values.max()  # NaN fails every comparison
            if low <= least and most <= high and math.isfinite(least) and math.isfinite(most):
                return
        bad = ~np.isfinite(values)
        if bad.any():
            flat = int(np.argmax(bad))
            at = _position(flat, values.shape)
            raise InputError(f"{where} has a non-finite value {values.flat[flat]} at position {at}")
        bad = (values < low) | (values > high)
        if bad.any():
            flat = int(np.argmax(bad))
            at = _position(flat, values.shape)
            raise InputError(
                f"{where} has value {values.flat[flat]:g} at position {at}, "
                f"outside the allowed range [{low:g}, {high:g}]"
            )

    def execute(self, batch: paddle.Tensor) -> paddle.Tensor:
        """Forward pass on this replica's place; ``batch`` must already be there."""
        if self.network is None:
            raise RuntimeError(f"{self.name}: execute before initialize")
        if device_name(batch.place) != device_name(self.place):  # both cached lookups
            raise RuntimeError(
                f"{self.name}: batch on {device_name(batch.place)}, replica on {device_name(self.place)}"
            )
        # PlaceEnv too: tensors the forward creates itself must land on this replica's place.
        with self._env, paddle.no_grad():
            return self.network(batch)

    @abc.abstractmethod
    def postprocess(self, outputs: paddle.Tensor) -> list[dict[str, Any]]:
        """One JSON-able dict per example."""

    def infer(self, inputs: Any) -> list[dict[str, Any]]:
        """One request end to end in the calling thread: preprocess, move to this replica's place,
        execute, postprocess. What a worker does for a batch of one, without the queue; the
        benchmarks' bare forward and the tests' direct answers."""
        return self.postprocess(self.execute(move_to(self.preprocess(inputs), self.place)))

    def finalize(self) -> None:
        """Drop the network so its device memory can be reclaimed."""
        self.network, self.place, self._env = None, None, None


def host_tensor(array: np.ndarray) -> paddle.Tensor:
    """A CPU tensor holding a copy of ``array``: what ``paddle.to_tensor(array, place=CPUPlace())`` gives.

    Not ``to_tensor``: in Paddle 3.3.1 the eager Tensor constructor behind it leaks
    one Python list (its keyword names) per call. Built per request, that grew the
    service ~150 B a request, and the growing heap made each full GC pause longer
    (soak p99 64 -> 211 ms in 12 min). ``_C_ops.empty`` + ``DenseTensor.set`` copy the
    same bytes with no constructor call; they are also 10 us where ``paddle.empty`` +
    ``set_value`` take 68, mostly argument handling. Both are Paddle internals, named
    in placeenv/_internals.py; tests/test_fastpaths.py checks the result against to_tensor.
    """
    tensor = _pd.C_ops_empty(list(array.shape), array.dtype, _HOST)
    _pd.dense_tensor_set(_pd.tensor_get_tensor(tensor), np.ascontiguousarray(array), _HOST)
    return tensor


def move_to(tensor: paddle.Tensor, place) -> paddle.Tensor:
    """``tensor.to(place)`` for a Paddle place object (a copy, blocking), without the ~65 us
    that ``Tensor.to`` spends parsing its arguments: ``to`` ends in this same ``_copy_to``."""
    moved = _pd.tensor_copy_to(tensor, place, True)
    moved.stop_gradient = tensor.stop_gradient
    return moved


def labelled(scores: np.ndarray, key: str) -> list[dict[str, Any]]:
    """``[{"label": argmax, key: row}]`` per row; ``tolist`` makes Python ints and floats in one C call each."""
    return [{"label": label, key: row} for label, row in zip(scores.argmax(axis=1).tolist(), scores.tolist())]


def softmax(logits: paddle.Tensor) -> np.ndarray:
    """Row-wise softmax on the host, float64 for stable JSON floats."""
    values = logits.numpy().astype(np.float64)
    values = np.exp(values - values.max(axis=1, keepdims=True))
    return values / values.sum(axis=1, keepdims=True)


def _position(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()

