"""The seed APIs of the design documents, on every device and in threads.

``torch-aligned-device-params.md``: creation APIs take ``device=``,
``requires_grad=`` and ``pin_memory=``; ``device=None`` is the current device,
which with placeenv is the calling thread's.
``tensor-to-layer-astype-design.md``: ``Tensor.to`` in every call form, and
``Layer.astype(dtype)`` casting every parameter and buffer.

Thread checks run in 4 threads pinned to cpu, sim:1, sim:2, sim:3 in lock-step;
with the ``mode`` fixture they also run on stock Paddle, where they must fail
(the negative control). On Paddle 3.3.1 (placeenv.fixes corrects the first three
when installed):

* ``zeros_like`` / ``ones_like`` / ``full_like`` put the result on the input's
  custom device when ``device=`` names another device of the same type
  (``_C_ops.full_like`` ignores the device id);
* ``device='cuda'`` (no index) on a build without CUDA raises an
  AttributeError from inside ``_get_paddle_place``;
* ``Tensor.to('uint16')`` takes the design's dtype for a device name, and
  ``Layer.astype`` drops its casts (Paddle #76614);
* ``pin_memory=True`` on a build without CUDA/XPU raises
  ``RuntimeError: Pinning memory is not supported for Place(<device>)``, the
  device being the one the tensor would have been made on.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import paddle
import pytest

import placeenv
from support import expect, on_each_device, where

pytestmark = [
    pytest.mark.filterwarnings("ignore::paddle.utils.deprecated.VisibleDeprecationWarning"),  # paddle.range
    pytest.mark.filterwarnings("ignore:When training, we now always track global mean:UserWarning"),
]

ALL_DEVICES = ("cpu", "sim:0", "sim:1", "sim:2", "sim:3")
#: For each thread's device, another device (to put a reference tensor somewhere else).
ELSEWHERE = {"cpu": "sim:2", "sim:1": "cpu", "sim:2": "sim:3", "sim:3": "sim:1"}
NO_PINNED_MEMORY = not (paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu())


def thread_state(device) -> dict:
    """What is wrong with the calling thread's device at both of Paddle's levels (empty: nothing)."""
    got = (paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32"))))
    return {} if got == (device,) * 3 else {"thread device": got}


def dtype_name(tensor) -> str:
    return str(tensor.dtype).replace("paddle.", "")


# --------------------------------------------------------------------------------------------
# Creation APIs with device= / requires_grad= / pin_memory=


@dataclass(frozen=True)
class Api:
    make: Callable  # make(**keywords) -> Tensor
    #: what device=None means: "thread" the current (thread's) device, "input" the input tensor's
    follows: str = "thread"
    requires_grad: bool = True
    pin_memory: bool = True


_INPUT = threading.local()  # .device: where this thread's _ref() puts the input (None: current device)


#: The layers' keywords: device= only.
LAYER = {"requires_grad": False, "pin_memory": False}


def _ref():
    """The input of the ``*_like`` / ``Tensor.new_*`` APIs: on the current device by default."""
    return paddle.ones([2, 2], device=getattr(_INPUT, "device", None))


#: Every public API whose signature has device=, requires_grad= or pin_memory= and that makes a
#: tensor (inspect.signature over paddle, paddle.tensor, paddle.Tensor, paddle.fft, paddle.nn;
#: test_api_list_is_complete keeps it so), with the arguments each needs.
APIS = {
    "paddle.arange": Api(lambda **kw: paddle.arange(3, **kw)),
    "paddle.range": Api(lambda **kw: paddle.range(0, 3, **kw), pin_memory=False),
    "paddle.linspace": Api(lambda **kw: paddle.linspace(0, 1, 3, **kw), pin_memory=False),
    "paddle.eye": Api(lambda **kw: paddle.eye(2, **kw)),
    "paddle.empty": Api(lambda **kw: paddle.empty([2], **kw)),
    "paddle.zeros": Api(lambda **kw: paddle.zeros([2], **kw)),
    "paddle.ones": Api(lambda **kw: paddle.ones([2], **kw)),
    "paddle.full": Api(lambda **kw: paddle.full([2], 1.5, **kw)),
    "paddle.rand": Api(lambda **kw: paddle.rand([2], **kw)),
    "paddle.randn": Api(lambda **kw: paddle.randn([2], **kw)),
    "paddle.randperm": Api(lambda **kw: paddle.randperm(4, **kw)),
    "paddle.standard_normal": Api(lambda **kw: paddle.standard_normal([2], **kw), pin_memory=False),
    "paddle.uniform": Api(lambda **kw: paddle.uniform([2], **kw), pin_memory=False),
    "paddle.tensor.random.gaussian": Api(lambda **kw: paddle.tensor.random.gaussian([2], **kw),
                                         pin_memory=False),
    "paddle.as_tensor": Api(lambda **kw: paddle.as_tensor([1.0, 2.0], **kw)),
    "paddle.tensor()": Api(lambda **kw: paddle.tensor([1.0, 2.0], **kw)),
    "paddle.asarray": Api(lambda **kw: paddle.asarray([1.0, 2.0], **kw), pin_memory=False),
    "paddle.bartlett_window": Api(lambda **kw: paddle.bartlett_window(4, **kw)),
    "paddle.blackman_window": Api(lambda **kw: paddle.blackman_window(4, **kw)),
    "paddle.hamming_window": Api(lambda **kw: paddle.hamming_window(4, **kw)),
    "paddle.hann_window": Api(lambda **kw: paddle.hann_window(4, **kw)),
    "paddle.kaiser_window": Api(lambda **kw: paddle.kaiser_window(4, **kw)),
    "paddle.fft.fftfreq": Api(lambda **kw: paddle.fft.fftfreq(4, **kw), pin_memory=False),
    "paddle.fft.rfftfreq": Api(lambda **kw: paddle.fft.rfftfreq(4, **kw), pin_memory=False),
    # device=None: the input's device (as torch; Paddle's docstrings say so too)
    "paddle.empty_like": Api(lambda **kw: paddle.empty_like(_ref(), **kw), follows="input"),
    "paddle.zeros_like": Api(lambda **kw: paddle.zeros_like(_ref(), **kw), follows="input"),
    "paddle.ones_like": Api(lambda **kw: paddle.ones_like(_ref(), **kw), follows="input"),
    "paddle.full_like": Api(lambda **kw: paddle.full_like(_ref(), 2.0, **kw), follows="input"),
    "paddle.rand_like": Api(lambda **kw: paddle.rand_like(_ref(), **kw), follows="input", pin_memory=False),
    "paddle.randn_like": Api(lambda **kw: paddle.randn_like(_ref(), **kw), follows="input", pin_memory=False),
    "Tensor.new_empty": Api(lambda **kw: _ref().new_empty([2], **kw), follows="input"),
    "Tensor.new_zeros": Api(lambda **kw: _ref().new_zeros([2], **kw), follows="input"),
    "Tensor.new_ones": Api(lambda **kw: _ref().new_ones([2], **kw), follows="input"),
    "Tensor.new_full": Api(lambda **kw: _ref().new_full([2], 3.0, **kw), follows="input"),
    # layers with device= (no requires_grad= / pin_memory=): their weight
    "paddle.nn.Conv1D": Api(lambda **kw: paddle.nn.Conv1D(1, 1, 1, **kw).weight, **LAYER),
    "paddle.nn.Conv2D": Api(lambda **kw: paddle.nn.Conv2D(1, 1, 1, **kw).weight, **LAYER),
    "paddle.nn.Conv3D": Api(lambda **kw: paddle.nn.Conv3D(1, 1, 1, **kw).weight, **LAYER),
    "paddle.nn.Embedding": Api(lambda **kw: paddle.nn.Embedding(3, 2, **kw).weight, **LAYER),
    "paddle.nn.GroupNorm": Api(lambda **kw: paddle.nn.GroupNorm(1, 2, **kw).weight, **LAYER),
    "paddle.nn.LayerNorm": Api(lambda **kw: paddle.nn.LayerNorm(2, **kw).weight, **LAYER),
}

#: Public callables with one of the keywords that make no tensor, or are tested on their own.
NOT_CREATION = {
    "paddle.set_device", "paddle.set_default_device", "paddle.device_guard", "paddle.get_device_module",
    "paddle.get_rng_state", "paddle.set_rng_state", "paddle.Generator", "paddle.Stream", "paddle.PlaceEnv",
    "paddle.Tensor.requires_grad_",  # flips stop_gradient of an existing tensor
    "paddle.from_dlpack",  # device=None: the producer's device; see test_from_dlpack_device
}

def _resolve(name):
    if name == "paddle.tensor()":
        return paddle.tensor.creation.tensor
    obj = paddle
    for part in name.replace("Tensor.", "paddle.Tensor.").split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def test_api_list_is_complete():
    """APIS names every public tensor-making callable with device=, requires_grad= or pin_memory=."""
    found = {}
    namespaces = {"paddle": paddle, "paddle.tensor": paddle.tensor, "paddle.Tensor": paddle.Tensor,
                  "paddle.fft": paddle.fft, "paddle.nn": paddle.nn}
    for prefix, namespace in namespaces.items():
        for attr in dir(namespace):
            if attr.startswith("_"):
                continue
            obj = getattr(namespace, attr, None)
            if not callable(obj):
                continue
            try:
                parameters = inspect.signature(obj).parameters
            except (TypeError, ValueError):
                continue
            if {"device", "requires_grad", "pin_memory"} & set(parameters):
                found.setdefault(id(obj), f"{prefix}.{attr}")
    known = {id(_resolve(name)) for name in APIS} | {id(_resolve(name)) for name in NOT_CREATION}
    assert sorted(name for key, name in found.items() if key not in known) == []


@pytest.mark.parametrize("device", ALL_DEVICES)
@pytest.mark.parametrize("api", sorted(APIS))
def test_explicit_device_lands_there(api, device):
    assert where(APIS[api].make(device=device)) == device
    assert paddle.get_device() == "sim:0"  # device= moves nothing


@pytest.mark.parametrize("api", sorted(APIS))
def test_device_none_follows_thread(mode, api):
    """device=None, and no device at all, is the calling thread's device (for *_like / new_*:
    the input's, made on the thread's device); requires_grad= changes nothing about it; an
    explicit device= in a thread lands there."""
    spec = APIS[api]

    def check(device):
        got = {"device=None": where(spec.make(device=None)), "no device": where(spec.make())}
        want = {"device=None": device, "no device": device}
        if spec.requires_grad:
            t = spec.make(requires_grad=True)
            got["requires_grad=True"] = (where(t), t.stop_gradient)
            want["requires_grad=True"] = (device, False)
        got["device=elsewhere"] = where(spec.make(device=ELSEWHERE[device]))
        want["device=elsewhere"] = ELSEWHERE[device]
        problems = {k: v for k, v in got.items() if v != want[k]}
        problems.update(thread_state(device))
        return problems

    expect(mode, on_each_device(check, rounds=2))


@pytest.mark.parametrize("api", sorted(n for n, s in APIS.items() if s.follows == "input"))
def test_like_device_none_follows_input(api):
    """For *_like and Tensor.new_*, device=None is the input's device, not the thread's."""
    make = APIS[api].make

    def check(device):
        _INPUT.device = ELSEWHERE[device]  # thread-local: gone with the thread
        got = (where(make(device=None)), where(make()))
        return None if got == (ELSEWHERE[device],) * 2 else got

    assert on_each_device(check, rounds=2) == []


@pytest.mark.parametrize("device", ALL_DEVICES)
@pytest.mark.parametrize("api", sorted(n for n, s in APIS.items() if s.requires_grad))
def test_requires_grad(api, device):
    make = APIS[api].make
    assert make(device=device, requires_grad=True).stop_gradient is False
    assert make(device=device, requires_grad=False).stop_gradient is True
    assert make(device=device).stop_gradient is True


def test_from_dlpack_device():
    """from_dlpack: device=None is the producer's device (cpu for numpy), whatever the thread's;
    Paddle's DLPack has no mapping for custom devices, so device='sim:N' raises."""
    array = np.arange(3, dtype="float32")
    assert where(paddle.from_dlpack(array)) == "cpu"
    assert where(paddle.from_dlpack(array, device="cpu")) == "cpu"
    with pytest.raises(NotImplementedError, match="CustomPlace is not supported"):
        paddle.from_dlpack(array, device="sim:1")


# --------------------------------------------------------------------------------------------
# pin_memory=True: needs CUDA or XPU. Without them Paddle raises a RuntimeError naming the place
# the tensor would have been made on.

PIN_APIS = sorted(n for n, s in APIS.items() if s.pin_memory)
pin_needs_no_gpu = pytest.mark.skipif(not NO_PINNED_MEMORY, reason="this build has pinned memory")


@pin_needs_no_gpu
@pytest.mark.parametrize("device", [None, "cpu", "sim:1"])
@pytest.mark.parametrize("api", PIN_APIS)
def test_pin_memory_without_cuda_raises(api, device):
    keywords = {} if device is None else {"device": device}
    named = device or "sim:0"  # device=None: the current device (or the input's, made there)
    with pytest.raises(RuntimeError, match=rf"Pinning memory is not supported for Place\({named}\)"):
        APIS[api].make(pin_memory=True, **keywords)


@pin_needs_no_gpu
@pytest.mark.parametrize("api", PIN_APIS)
def test_pin_memory_error_names_the_thread_device(mode, api):
    make = APIS[api].make

    def check(device):
        try:
            make(pin_memory=True)
        except RuntimeError as exc:
            return None if f"Place({device})" in str(exc) else str(exc)
        return "no error"

    expect(mode, on_each_device(check, rounds=2))


@pytest.mark.skipif(paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu(), reason="has CUDA/XPU")
@pytest.mark.parametrize("device", ["cuda", "gpu", "gpu_pinned", "xpu"])
def test_device_kind_without_build_raises_clearly(device):
    """device='cuda' (torch-aligned) on a CPU-only build: a ValueError saying what is missing."""
    with pytest.raises(ValueError, match="not compiled with"):
        paddle.ones([2], device=device)


@pin_needs_no_gpu
def test_tensor_pin_memory_without_cuda_raises():
    for device in ("cpu", "sim:1"):
        with pytest.raises(RuntimeError, match="Cannot use CUDAPinnedPlace in CPU only version"):
            paddle.ones([2], device=device).pin_memory()


# --------------------------------------------------------------------------------------------
# Tensor.to in every call form. Each form gets (tensor, target device name, a float64 tensor
# on the target) and gives (result, device wanted, dtype wanted, identity wanted): the device
# None means the tensor's own; identity True/False: the result must / must not be the tensor.

def _place(name):
    return paddle.CPUPlace() if name == "cpu" else paddle.CustomPlace("sim", int(name.split(":")[1]))


TO_FORMS = {
    "dtype": lambda t, dst, o: (t.to("float64"), None, "float64", False),
    "dtype, blocking": lambda t, dst, o: (t.to("float64", True), None, "float64", False),
    "dtype, blocking=": lambda t, dst, o: (t.to("float64", blocking=False), None, "float64", False),
    "dtype, non_blocking=": lambda t, dst, o: (t.to(paddle.float64, non_blocking=True), None, "float64",
                                               False),
    "paddle dtype": lambda t, dst, o: (t.to(paddle.float16), None, "float16", False),
    "numpy dtype": lambda t, dst, o: (t.to(np.dtype("float64")), None, "float64", False),
    "dtype=": lambda t, dst, o: (t.to(dtype="float64"), None, "float64", False),
    "same dtype, copy=": lambda t, dst, o: (t.to("float32", copy=True), None, "float32", False),
    "device": lambda t, dst, o: (t.to(dst), dst, "float32", None),
    "Place": lambda t, dst, o: (t.to(_place(dst)), dst, "float32", None),
    "device, blocking=": lambda t, dst, o: (t.to(dst, blocking=False), dst, "float32", None),
    "device, non_blocking=": lambda t, dst, o: (t.to(dst, non_blocking=True), dst, "float32", None),
    "device, copy=": lambda t, dst, o: (t.to(dst, copy=True), dst, "float32", False),
    "device, dtype": lambda t, dst, o: (t.to(dst, "float64"), dst, "float64", False),
    "device, float32": lambda t, dst, o: (t.to(dst, "float32"), dst, "float32", None),
    "device, dtype, blocking": lambda t, dst, o: (t.to(dst, "float64", True), dst, "float64", False),
    "device=": lambda t, dst, o: (t.to(device=dst), dst, "float32", None),
    "device=, dtype=": lambda t, dst, o: (t.to(device=dst, dtype="float64"), dst, "float64", False),
    "device=, dtype=, blocking=": lambda t, dst, o: (t.to(device=dst, dtype="float64", blocking=True),
                                                     dst, "float64", False),
    "device=None": lambda t, dst, o: (t.to(device=None), None, "float32", True),
    "own device": lambda t, dst, o: (t.to(where(t)), None, "float32", True),
    "other": lambda t, dst, o: (t.to(o), dst, "float64", False),
    "other, blocking": lambda t, dst, o: (t.to(o, True), dst, "float64", False),
    "other=": lambda t, dst, o: (t.to(other=o), dst, "float64", False),
    "other, non_blocking=": lambda t, dst, o: (t.to(o, non_blocking=True), dst, "float64", False),
}

VALUES = [1.5, -2.0, 0.0]


def _to_problems(form, t, dst) -> dict:
    own = where(t)
    other = paddle.ones([1], dtype="float64", device=dst)
    result, want_device, want_dtype, identity = TO_FORMS[form](t, dst, other)
    want = (want_device or own, want_dtype)
    got = (where(result), dtype_name(result))
    problems = {}
    if got != want:
        problems[f"{own}->{dst}"] = got
    if identity is not None and (result is t) != identity:
        problems[f"{own}->{dst} identity"] = result is t
    if not np.array_equal(result.numpy(), np.array(VALUES, want_dtype)):
        problems[f"{own}->{dst} values"] = result.numpy().tolist()
    if where(t) != own or dtype_name(t) != "float32":
        problems[f"{own}->{dst} source changed"] = (where(t), dtype_name(t))
    return problems


@pytest.mark.parametrize("form", list(TO_FORMS))
def test_tensor_to_every_device(form):
    """Every form, from every device to every device (main thread)."""
    problems = {}
    for src in ALL_DEVICES:
        for dst in ALL_DEVICES:
            problems.update(_to_problems(form, paddle.tensor(VALUES, device=src), dst))
    assert problems == {}
    assert paddle.get_device() == "sim:0"


@pytest.mark.parametrize("form", list(TO_FORMS))
def test_tensor_to_in_threads(mode, form):
    """In each thread, a tensor made on the thread's device goes everywhere; afterwards the
    thread is still on its device (Tensor.to's internal place guard does not leak)."""

    def check(device):
        t = paddle.tensor(VALUES)  # device=None: the thread's
        problems = {} if where(t) == device else {"made on": where(t)}
        for dst in ALL_DEVICES:
            problems.update(_to_problems(form, t, dst))
            if paddle.get_device() != device:
                problems[f"after ->{dst}"] = paddle.get_device()
        problems.update(thread_state(device))
        return problems

    expect(mode, on_each_device(check, rounds=2))


@pytest.mark.parametrize("device", ["cpu", "sim:1"])
def test_tensor_to_uint16(device):
    """The design's dtype list has 'uint16'; Tensor.cast('uint16') gives Paddle's bfloat16."""
    t = paddle.tensor(VALUES, device=device)
    result = t.to("uint16")
    assert (where(result), result.dtype) == (device, t.cast("uint16").dtype)


# --------------------------------------------------------------------------------------------
# Layer.astype: every parameter and buffer, in place, on its device.

#: The design's dtype list (tensor-to-layer-astype-design.md).
DESIGN_DTYPES = ("bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
                 "uint8", "uint16", "complex64", "complex128", "bool")
FORWARD_DTYPES = ("float32", "float64")  # Paddle 3.3.1 has no CPU float16/bfloat16 matmul/add kernels


def _cast_dtype(name):
    """The dtype Tensor.cast gives on CPU (uint16 is bfloat16 in Paddle 3.3.1), or None."""
    try:
        return paddle.ones([1], device="cpu").cast(name).dtype
    except Exception:  # noqa: BLE001 - a dtype Paddle cannot cast at all
        return None


CAST_DTYPES = {name: _cast_dtype(name) for name in DESIGN_DTYPES}


def _dtype_params(names=DESIGN_DTYPES):
    for name in names:
        marks = () if CAST_DTYPES[name] is not None else pytest.mark.skip(
            reason=f"Paddle cannot cast to {name} at all (Tensor.cast raises)")
        yield pytest.param(name, marks=marks, id=name)


class Affine(paddle.nn.Layer):
    """Buffers, one persistable and one not."""

    def __init__(self, n):
        super().__init__()
        self.register_buffer("scale", paddle.to_tensor(np.linspace(-1.5, 2.5, n).astype("float32")))
        self.register_buffer("shift", paddle.full([n], -0.5), persistable=False)

    def forward(self, x):
        return x * self.scale + self.shift


def make_model():
    """Linear + BatchNorm1D (its _mean/_variance are non-trainable parameters in Paddle) + buffers,
    with fixed values and gradients, on the current device."""
    model = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.BatchNorm1D(4), Affine(4))
    rng = np.random.default_rng(0)
    for name, p in model.named_parameters():
        values = rng.normal(size=p.shape) * 3
        if name.endswith("_variance"):
            values = np.abs(values) + 0.5
        p.set_value(values.astype("float32"))
    x = paddle.to_tensor(np.arange(6, dtype="float32").reshape(2, 3))
    model(x).sum().backward()  # train mode: gradients, and moved running statistics
    return model


def _tensors(model):
    """name -> tensor for every parameter and buffer; 'grad:' + name for gradients."""
    out = dict(model.named_parameters())
    out.update({f"buffer:{n}": b for n, b in model.named_buffers()})
    out.update({f"grad:{n}": p.grad for n, p in model.named_parameters() if p.grad is not None})
    return out


def _snapshot(model):
    return {n: t.detach().clone() for n, t in _tensors(model).items()}


def astype_problems(spelling, dtype_name_, device, check_identity=True) -> dict:
    """Everything wrong with ``Layer.astype`` on a model made on the current device (``device``).

    Compared with a twin that ``Layer.to(dtype=...)`` casts: the same dtypes, values and devices
    for every parameter, buffer and gradient; and each tensor is its cast original, in place.
    """
    want_dtype = CAST_DTYPES[dtype_name_]
    model, twin = make_model(), make_model()
    before = _snapshot(model)
    objects = {n: id(t) for n, t in _tensors(model).items() if not n.startswith("grad:")}
    problems = {}
    try:
        result = model.astype(spelling)
    except Exception as exc:  # noqa: BLE001 - reported
        return {"astype raised": f"{type(exc).__name__}: {exc}"}
    if result is not model:
        problems["returned"] = type(result).__name__
    twin.to(dtype=dtype_name_)
    after, twin_after = _tensors(model), _tensors(twin)
    for name, old in before.items():
        t = after[name]
        if (where(t), t.dtype) != (device, want_dtype):
            problems[name] = (where(t), dtype_name(t))
        if check_identity and name in objects and id(t) != objects[name]:
            problems[f"{name} replaced"] = True
        if not np.array_equal(t.numpy(), old.cast(want_dtype).numpy()):
            problems[f"{name} values"] = True
        u = twin_after[name]
        if (where(t), t.dtype) != (where(u), u.dtype) or not np.array_equal(t.numpy(), u.numpy()):
            problems[f"{name} differs from Layer.to"] = ((where(t), dtype_name(t)), (where(u), dtype_name(u)))
    if dtype_name_ in FORWARD_DTYPES and not problems:
        model.eval()
        twin.eval()
        x = paddle.to_tensor(np.arange(6).reshape(2, 3), dtype=dtype_name_)
        out, twin_out = model(x), twin(x)
        if (where(out), dtype_name(out)) != (device, dtype_name_):
            problems["forward"] = (where(out), dtype_name(out))
        elif not np.array_equal(out.numpy(), twin_out.numpy()):
            problems["forward values"] = (out.numpy(), twin_out.numpy())
    return problems


@pytest.mark.parametrize("device", ALL_DEVICES)
@pytest.mark.parametrize("dtype", list(_dtype_params()))
def test_layer_astype_casts(dtype, device):
    with placeenv.PlaceEnv(device):
        assert astype_problems(dtype, dtype, device) == {}
        assert paddle.get_device() == device
    assert paddle.get_device() == "sim:0"


@pytest.mark.parametrize("dtype", list(_dtype_params()))
def test_layer_astype_in_threads(mode, dtype):
    """Each thread casts a model made on its device; stock fails (no cast, and the shared device)."""

    def check(device):
        problems = astype_problems(dtype, dtype, device)
        problems.update(thread_state(device))
        return problems

    expect(mode, on_each_device(check, rounds=1))


@pytest.mark.parametrize("dtype", list(_dtype_params(d for d in DESIGN_DTYPES if d != "float32")))
def test_stock_layer_astype_does_not_cast(stock, dtype):
    """Negative control (Paddle #76614): stock astype leaves the dtypes, and the check sees it.
    (float32 is left out: the model already is float32.)"""
    with placeenv.PlaceEnv("sim:1"):
        problems = astype_problems(dtype, dtype, "sim:1")
    assert "astype raised" in problems or problems.get("0.weight") == ("sim:1", "float32")


@pytest.mark.parametrize("spelling", [paddle.float64, np.dtype("float64"), paddle.float16,
                                      np.dtype("int32"), paddle.bool],
                         ids=["paddle.float64", "np.float64", "paddle.float16", "np.int32", "paddle.bool"])
def test_layer_astype_dtype_objects(spelling):
    name = str(spelling).replace("paddle.", "")
    with placeenv.PlaceEnv("sim:2"):
        assert astype_problems(spelling, name, "sim:2") == {}


INVALID_DTYPES = {"float99": "float99", "upper case": "FLOAT16", "None": None, "numpy type": np.float64,
                  "int": 3, "Place": paddle.CPUPlace()}


@pytest.mark.parametrize("bad", list(INVALID_DTYPES))
def test_layer_astype_invalid_dtype_raises_as_stock(bad):
    value = INVALID_DTYPES[bad]

    def attempt():
        model = make_model()
        with pytest.raises(Exception) as info:
            model.astype(value)
        dtypes = {dtype_name(t) for t in _tensors(model).values()}
        return type(info.value), str(info.value), dtypes

    placeenv.uninstall()
    try:
        stock = attempt()
    finally:
        placeenv.install()
    installed = attempt()
    assert installed == stock
    assert stock[0] is ValueError and stock[2] == {"float32"}


# --------------------------------------------------------------------------------------------
# Layer.to / Layer.type and friends in threads (they share Layer._transform's place guard).

LAYER_MOVES = {
    "to(dtype=)": (lambda m, d: m.to(dtype="float64"), None, "float64"),
    "to(device)": (lambda m, d: m.to(ELSEWHERE[d]), "elsewhere", "float32"),
    "to(device, dtype)": (lambda m, d: m.to(ELSEWHERE[d], "float64"), "elsewhere", "float64"),
    "type": (lambda m, d: m.type("float64"), None, "float64"),
    "half": (lambda m, d: m.half(), None, "float16"),
    "astype": (lambda m, d: m.astype("float64"), None, "float64"),
}


@pytest.mark.parametrize("move", list(LAYER_MOVES))
def test_layer_moves_in_threads(mode, move):
    apply, where_to, want_dtype = LAYER_MOVES[move]

    def check(device):
        model = make_model()
        result = apply(model, device)
        want_device = ELSEWHERE[device] if where_to == "elsewhere" else device
        got = {(where(t), dtype_name(t)) for t in _tensors(model).values()}
        problems = {} if got == {(want_device, want_dtype)} else {"tensors": got}
        if result is not model:
            problems["returned"] = type(result).__name__
        problems.update(thread_state(device))
        return problems

    expect(mode, on_each_device(check, rounds=1))


def test_stock_paddle_needs_the_seed_fixes(stock):
    """Negative control for placeenv.fixes: each corrected behaviour, as stock Paddle 3.3.1 has it."""
    x = paddle.zeros([2], device="sim:0")
    assert where(paddle.zeros_like(x, device="sim:3")) == "sim:0"  # device= ignored
    assert where(paddle.full_like(x, 1.0, device="sim:2")) == "sim:0"
    if not paddle.is_compiled_with_cuda():
        with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'group'"):
            paddle.ones([2], device="cuda")
    with pytest.raises(ValueError, match="The device must be a string"):
        x.to("uint16")


@pytest.mark.parametrize("device", ["cpu", "sim:1"])
def test_tensor_to_a_tensor_of_many_elements(device):
    """``x.to(other)`` with a multi-element ``other``: nothing compares ``other`` with a dtype string."""
    other = paddle.tensor([1, 2, 3], device="sim:3", dtype="int32")
    result = paddle.tensor(VALUES, device=device).to(other)
    assert (where(result), result.dtype) == ("sim:3", paddle.int32)
