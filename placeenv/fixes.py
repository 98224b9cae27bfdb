"""Fixes to Paddle's creation and cast APIs, where stock Paddle 3.3.1 falls short of their design.

The design documents (the "seeds": ``device=``, ``Tensor.to``, ``Layer.astype``)
say what these APIs do. Installed by :func:`placeenv.install` and taken out by
``uninstall()``, like the device patch. Each piece names the stock behaviour it
corrects:

* ``Layer.astype(dtype)`` casts nothing: it computes ``param._to(None, dtype)``
  and drops the result (Paddle #76614). Here it casts every parameter, its
  gradient and every buffer in place, as ``Layer.to(dtype=)`` does.
* ``Tensor.to('uint16')`` takes the design's dtype string for a device name.
* ``zeros_like`` / ``ones_like`` / ``full_like(x, ..., device=d)`` return a
  tensor on ``x``'s device when ``x`` is on a custom device: the kernel keeps
  its input's place. The result is moved to ``d``.
* ``device='gpu'`` (``'cuda'``, ``'gpu_pinned'``, ``'xpu'``, ...) without an
  index, on a build without that backend, raises ``AttributeError:
  'NoneType' object has no attribute 'group'``. It raises the ValueError the
  indexed form raises.

``pin_memory=True`` needs pinned host memory, which only CUDA and XPU builds
have; Paddle already refuses it clearly elsewhere (``RuntimeError: Pinning
memory is not supported for Place(cpu)``), so it is left as it is.
"""

from __future__ import annotations

import numpy as np

from . import _internals as _pd
from .places import available_devices, device_name
from .tensors import move_to

#: The dtype strings the Tensor.to / Layer.astype design accepts.
DESIGN_DTYPES = ("bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
                 "uint8", "uint16", "complex64", "complex128", "bool")

_stock: dict = {}  # (class, method name) -> the stock method, while installed


def layer_astype(self, dtype=None):
    """Cast every parameter (and its gradient) and every buffer of the layer and its
    sublayers to ``dtype``, in place, and return the layer.

    ``dtype`` is one of :data:`DESIGN_DTYPES`, a ``paddle.dtype`` or a numpy
    dtype; anything else goes to stock ``astype``, which raises its ValueError.
    """
    if isinstance(dtype, (_pd.paddle.dtype, np.dtype)) or (type(dtype) is str and dtype in DESIGN_DTYPES):
        if not isinstance(dtype, _pd.paddle.dtype):
            dtype = _pd.paddle_dtype(dtype)
        _pd.cast_layer(self, dtype)
        return self
    return _stock[(_pd.Layer, "astype")](self, dtype)


def tensor_to(self, *args, **kwargs):
    """``Tensor.to``, with the design's dtype string ``'uint16'`` taken as the dtype ``cast('uint16')``
    gives (Paddle's bfloat16), not as a device name."""
    if any(type(a) is str and a == "uint16" for a in args) or kwargs.get("dtype") == "uint16":
        uint16 = _pd.paddle_dtype("uint16")
        args = tuple(uint16 if type(a) is str and a == "uint16" else a for a in args)
        if kwargs.get("dtype") == "uint16":
            kwargs["dtype"] = uint16
    return _stock[(_pd.paddle.Tensor, "to")](self, *args, **kwargs)


#: Method name -> its replacement, for every method the contract lists (Layer.astype, Tensor.to).
METHODS = {"astype": layer_astype, "to": tensor_to}


def install() -> None:
    """Put the replacements on their classes, keeping the stock methods they fall back to.
    (``placeenv.patch`` saves what it replaces and restores it on uninstall.)"""
    for cls, name in _pd.method_targets:
        _stock[(cls, name)] = cls.__dict__[name]
        setattr(cls, name, METHODS[name])


def land(tensor, device):
    """``tensor`` on ``device``: a ``*_like(device=...)`` result whose kernel kept its input's place."""
    if not isinstance(tensor, _pd.paddle.Tensor):  # static graph: a Variable or Value
        return tensor
    place = _pd.paddle_place(device)  # the parser the creation APIs use (patched)
    if device_name(tensor.place) == device_name(place):
        return tensor
    return move_to(tensor, place)


_NOT_COMPILED = {"gpu": "CUDA", "gpu_pinned": "CUDA", "dcu": "CUDA",
                 "xpu": "XPU", "xpu_pinned": "XPU", "ipu": "IPU"}


def explain_place(place) -> None:
    """Raise the ValueError Paddle meant for a backend name this build lacks (it hit a None match)."""
    if isinstance(place, str):
        kind = place.lower().replace("cuda", "gpu", 1)
        if kind in _NOT_COMPILED:
            raise ValueError(
                f"The device should not be {place!r}, since PaddlePaddle is not compiled with "
                f"{_NOT_COMPILED[kind]}; available devices: {', '.join(available_devices())}"
            )
