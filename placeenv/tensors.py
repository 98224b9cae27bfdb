"""Tensors without the eager constructor: what the service's request path and placeenv.fixes use.

``paddle.to_tensor`` and ``Tensor.to`` parse their arguments on every call, and
in Paddle 3.3.1 the eager constructor behind ``to_tensor`` leaks a Python list
per call (see docs/benchmarks.md). A server makes tensors per request, so these
go straight to the copies those APIs end in.
"""

from __future__ import annotations

import threading

import numpy as np

from . import _internals as _pd

__all__ = ["JIT_LOAD_LOCK", "host_tensor", "host_view", "move_to", "program_signature"]

#: ``paddle.jit.load`` builds the program through Paddle's one global PIR insertion
#: point, so two threads loading at once fail ("The block obtained before and after
#: calling the static API name is inconsistent"): hold this around every load.
JIT_LOAD_LOCK = threading.Lock()


def host_tensor(array: np.ndarray):
    """A CPU tensor holding a copy of ``array``: what ``paddle.to_tensor(array, place=CPUPlace())`` gives."""
    tensor = _pd.empty_host(list(array.shape), array.dtype)
    _pd.fill_host(tensor, np.ascontiguousarray(array))
    return tensor


def host_view(array: np.ndarray):
    """A CPU tensor over ``array``'s memory (made C-contiguous first, its shape kept), no copy: it keeps the
    array alive."""
    return _pd.view_host(array if array.flags.c_contiguous else np.ascontiguousarray(array))


def move_to(tensor, place):
    """``tensor.to(place)`` for a Paddle place object: a blocking copy, keeping ``stop_gradient``."""
    moved = _pd.copy_to(tensor, place)
    moved.stop_gradient = tensor.stop_gradient
    return moved


def program_signature(layer):
    """A ``paddle.jit.load``ed layer's (input specs, output specs), each spec with name, dtype and shape."""
    return _pd.program_signature(layer)
