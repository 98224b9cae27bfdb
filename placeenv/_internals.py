"""Every Paddle internal that placeenv and its service touch or call, in one place.

Importing this module does not import Paddle. The names below become
attributes of this module when :func:`resolve` runs (``install()`` runs it, and
so does the first read of any of them): it checks Paddle's version first, then
looks every name up, and an unsupported Paddle gets one
:class:`UnsupportedPaddleError` listing everything it lacks, never an
``AttributeError`` from deep inside a patch.

The patch swaps the *code* of Paddle's own function objects, because about 40
Paddle modules import them by name (``from ..framework import
_current_expected_place``); rebinding a module attribute would miss them.
A swapped function keeps its globals (``paddle.base.framework``), so the
replacement bodies at the end of this file read Paddle's own names
(``_global_expected_place_``, ``core``) plus a few helpers that the patch
injects under ``_placeenv_*`` names. ``uninstall()`` puts the original code
objects back and deletes the injected names, so stock Paddle is restored
exactly.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
import threading
import types
import warnings

# Versions whose internals were read and tested. Anything else fails loudly
# unless PLACEENV_ALLOW_UNTESTED_PADDLE=1.
TESTED_PADDLE = ("3.3",)
ALLOW_UNTESTED_ENV = "PLACEENV_ALLOW_UNTESTED_PADDLE"


class UnsupportedPaddleError(RuntimeError):
    """The imported Paddle is a version placeenv has not checked, or lacks an internal it uses."""


def check_version(version: str | None = None) -> None:
    if version is None:
        version = importlib.import_module("paddle").__version__
    if version.startswith(tuple(v + "." for v in TESTED_PADDLE)):
        return
    message = (
        f"placeenv patches Paddle internals and was tested with Paddle "
        f"{', '.join(v + '.x' for v in TESTED_PADDLE)}; this is Paddle {version}. "
        f"Set {ALLOW_UNTESTED_ENV}=1 to try anyway."
    )
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        return
    raise UnsupportedPaddleError(message)


# -- the internals, by where they live in the ``paddle`` package -------------

#: This module's name for each internal -> its dotted path under ``paddle``.
NAMES = {
    # The device state. ``framework`` holds ``_global_expected_place_`` (the
    # Python copy of the current device) and ``_dygraph_tracer_`` (the Tracer
    # every new thread starts with); ``global_var`` is the threading.local with
    # each thread's Tracer; ``switch_tracer`` sets the C++ thread-local one
    # (egr::Controller) that Paddle's C++ side reads.
    "framework": "base.framework",
    "core": "base.core",
    "global_var": "base.framework.global_var",
    "Tracer": "base.dygraph.tracer.Tracer",
    "switch_tracer": "base.core._switch_tracer",
    "Place": "base.core.Place",
    "CPUPlace": "base.core.CPUPlace",
    "CUDAPlace": "base.core.CUDAPlace",
    "XPUPlace": "base.core.XPUPlace",
    "CustomPlace": "base.core.CustomPlace",
    "CUDAPinnedPlace": "base.core.CUDAPinnedPlace",
    "device_guard": "device.device_guard",
    # What devices this process has (placeenv.places).
    "is_compiled_with_cuda": "base.core.is_compiled_with_cuda",
    "is_compiled_with_xpu": "base.core.is_compiled_with_xpu",
    "cuda_device_count": "base.core.get_cuda_device_count",
    "xpu_device_count": "base.core.get_xpu_device_count",
    "custom_device_count": "base.core.get_custom_device_count",
    "custom_device_types": "base.core.get_all_custom_device_type",
    # A custom device's random generator (placeenv.patch.install makes them all).
    "custom_device_generator": "base.core.default_custom_device_generator",
    # Static mode in this thread only, for install's one program run (its event pools).
    "dygraph_guard": "base.framework._dygraph_guard",
    # The fixes (placeenv.fixes): the in-place cast Layer.to uses, for Layer.astype.
    "Layer": "nn.Layer",
    "layer_to_impl": "nn.Layer._to_impl",
    "convert_dtype": "base.framework.convert_np_dtype_to_dtype_",
    # The service's request path (placeenv.serve.models.base): a host tensor
    # without the eager constructor's argument parsing, and the move Tensor.to
    # ends in.
    "C_ops_empty": "_C_ops.empty",
    "tensor_get_tensor": "Tensor.get_tensor",
    "dense_tensor_set": "base.core.DenseTensor.set",
    "tensor_copy_to": "Tensor._copy_to",
    # The model repository (placeenv.serve.models.repository): a saved program's
    # inputs and outputs (name, dtype, shape), as paddle.jit.load's layer knows them.
    "jit_input_spec": "jit.pir_translated_layer.PirTranslatedLayer._input_spec",
    "jit_output_spec": "jit.pir_translated_layer.PirTranslatedLayer._output_spec",
    # A Predictor's run without the GIL (placeenv.native): the binding's module, whose shared library
    # holds Paddle Inference's C++ API, and the Python class of a Predictor.
    "libpaddle": "base.libpaddle",
    "InferPredictor": "base.libpaddle.PaddleInferPredictor",
}

#: Names a build may lack: None then (a CPU-only wheel has no CUDA or XPU device counts; one without the
#: binding's Predictor class or library runs every Predictor through the binding).
OPTIONAL = frozenset({"cuda_device_count", "xpu_device_count", "libpaddle", "InferPredictor"})

#: Module globals of ``framework`` that placeenv reads and writes.
FRAMEWORK_GLOBALS = ("_global_expected_place_", "_dygraph_tracer_")

#: Attributes of a Tracer that placeenv reads or writes: the device it carries,
#: and the train mode a thread's own Tracer inherits from the one it replaces.
TRACER_ATTRS = ("_expected_place", "_train_mode")

#: Functions whose ``__code__`` is replaced, by dotted path under ``paddle``.
#: ``_dygraph_place_guard`` is a contextmanager; its generator is ``__wrapped__``.
#: ``GlobalThreadLocal.__setattr__`` rebinds ``framework._dygraph_tracer_`` (the
#: Tracer each new thread starts with) whenever *any* thread switches Tracer,
#: which would hand a thread's private Tracer to every thread started later.
#: ``set_device`` keeps its body (a stock copy runs) and explains a refused
#: ``'sim:N'`` (placeenv.places.explain_device). ``_get_paddle_place`` (the
#: ``device=`` parser of the creation APIs) and ``full_like`` (behind
#: ``zeros_like`` / ``ones_like``) also run their stock copies, then correct
#: what placeenv.fixes describes.
CODE_TARGETS = (
    "base.framework._current_expected_place_",
    "base.framework._set_expected_place",
    "base.framework._dygraph_place_guard",
    "base.framework.GlobalThreadLocal.__setattr__",
    "device.set_device",
    "base.framework._get_paddle_place",
    "tensor.creation.full_like",
)

#: Context-manager classes whose ``__enter__``/``__exit__`` keep state on the
#: instance (``paddle.device.device``, ``device_guard``) or on the class
#: (``paddle.device.Device._DEFAULT_DEVICE_STACK``): replaced by methods that
#: keep a per-context stack. ``paddle.cuda.device`` is the same class object.
#: Each with the attribute its replacement reads the target device from.
GUARD_CLASSES = (
    ("device.device", "place"),
    ("device.device_guard", "_target_place"),
    ("device.Device", None),  # a str subclass: the device is its own value
)

#: Methods replaced by versions that do what the design says (placeenv.fixes).
METHOD_TARGETS = (("nn.Layer", "astype"), ("Tensor", "to"))

#: Paddle Inference's C++ entry points placeenv.native calls through ctypes, as the binding's library
#: exports them: ``bool paddle_infer::Predictor::Run()`` (the documented C++ API), and the vtable of
#: ``paddle::AnalysisPredictor``, what ``create_predictor`` builds behind a Predictor.
PREDICTOR_RUN_SYMBOL = "_ZN12paddle_infer9Predictor3RunEv"
ANALYSIS_PREDICTOR_VTABLE = "_ZTVN6paddle17AnalysisPredictorE"

#: Aliases added on install: the design's public name.
ALIASES = (("", "PlaceEnv"), ("device", "PlaceEnv"))

_lock = threading.RLock()
_resolved: dict | None = None


def _lookup(root, path: str):
    value = root
    for part in path.split("."):
        value = getattr(value, part)
    return value


def resolve() -> None:
    """Import Paddle, check its version, then look up every internal above (once)."""
    global _resolved
    if _resolved is not None:
        return
    # Outside the lock: the first `import paddle` holds Paddle's import lock and
    # runs placeenv's import hook, whose install() resolves (in that thread).
    paddle = importlib.import_module("paddle")
    with _lock:
        if _resolved is not None:
            return
        check_version(paddle.__version__)
        found, missing = {"paddle": paddle}, []
        for name, path in NAMES.items():
            try:
                found[name] = _lookup(paddle, path)
            except (AttributeError, ImportError):
                if name in OPTIONAL:
                    found[name] = None
                else:
                    missing.append(f"paddle.{path}")
        framework = found.get("framework")
        checks = [(f"paddle.base.framework.{g}", lambda g=g: framework.__dict__[g])
                  for g in FRAMEWORK_GLOBALS]
        checks += [(f"paddle.{n}.__code__", lambda n=n: code_owner(n, paddle).__code__) for n in CODE_TARGETS]
        checks += [(f"paddle.{p}.__enter__/__exit__",
                    lambda p=p: [_lookup(paddle, p).__dict__[m] for m in ("__enter__", "__exit__")])
                   for p, _ in GUARD_CLASSES]
        checks += [(f"paddle.{p}.{m}", lambda p=p, m=m: _lookup(paddle, p).__dict__[m])
                   for p, m in METHOD_TARGETS]
        if "Tracer" in found:
            tracer = found["Tracer"]()
            checks += [(f"Tracer().{a}", lambda a=a: getattr(tracer, a)) for a in TRACER_ATTRS]
        # The attribute each guard's target device is read from.
        checks += [(f"paddle.{p}('cpu').{a}", lambda p=p, a=a: getattr(_lookup(paddle, p)("cpu"), a))
                   for p, a in GUARD_CLASSES if a is not None]
        if "Place" in found:
            checks.append(("paddle.base.core.Place().set_place", lambda: found["Place"]().set_place))
        for label, check in checks:
            try:
                check()
            except (AttributeError, KeyError, TypeError):
                missing.append(label)
        if missing:
            raise UnsupportedPaddleError(
                f"Paddle {paddle.__version__} lacks internals placeenv uses: {', '.join(missing)}"
            )
        # Copies of the stock functions, made before any patch: the patch's
        # replacements call some of them, and first_use_place() runs one.
        found["stock"] = {path: _copy(code_owner(path, paddle)) for path in CODE_TARGETS}
        found["global_place"] = functools.partial(framework.__dict__.get, "_global_expected_place_")
        found["HOST"] = found["CPUPlace"]()
        found["guard_classes"] = tuple((_lookup(paddle, p), attr) for p, attr in GUARD_CLASSES)
        found["method_targets"] = tuple((_lookup(paddle, p), m) for p, m in METHOD_TARGETS)
        found["aliases"] = tuple((_lookup(paddle, p) if p else paddle, a) for p, a in ALIASES)
        globals().update(found)
        _resolved = found


#: What resolve() adds besides NAMES.
_DERIVED = ("paddle", "stock", "global_place", "HOST", "guard_classes", "method_targets", "aliases")


def __getattr__(name: str):
    # Reading an internal before install() resolves them all, version check first.
    if name in NAMES or name in _DERIVED:
        resolve()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _copy(fn):
    """A callable copy of ``fn`` as it is now: its code, globals and defaults."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def code_owner(path: str, paddle=None):
    """The function object whose ``__code__`` we swap for ``paddle.<path>``."""
    fn = _lookup(paddle if paddle is not None else globals()["paddle"], path)
    return getattr(fn, "__wrapped__", fn)


# -- the device state, as functions ------------------------------------------
# placeenv.state reads and writes Paddle's device state only through these,
# and through ``global_place()``: the global device
# (``framework._global_expected_place_``, None or a concrete place), which
# resolve() binds as a C-level dict read since every PlaceEnv entry on the main
# thread reads it.


def set_global_place(place) -> None:
    """Store ``place`` (or None: not chosen yet) as the global device, on the Python level only."""
    framework._global_expected_place_ = place


def shared_tracer():
    """The Tracer every new thread starts with (``framework._dygraph_tracer_``): the main thread's."""
    return framework._dygraph_tracer_


def set_shared_tracer(tracer) -> None:
    framework._dygraph_tracer_ = tracer


def thread_tracer():
    """The calling thread's Tracer, or None (static mode)."""
    return global_var.__dict__.get("_dygraph_tracer_")


def activate(tracer) -> None:
    """Run the calling thread on ``tracer``, on both levels, without the patched ``__setattr__``."""
    global_var.__dict__["_dygraph_tracer_"] = tracer
    switch_tracer(tracer)


def new_tracer(place):
    """A Tracer of placeenv's own, carrying ``place``."""
    tracer = Tracer()
    tracer._expected_place = place
    return tracer


def aim(tracer, place) -> None:
    """Make ``tracer`` carry ``place`` (what Paddle's C++ side creates tensors on)."""
    tracer._expected_place = place


def carry_train_mode(source, target) -> None:
    """``Layer.train()`` / ``eval()`` set the mode on a thread's Tracer: carry it to ``target``."""
    target._train_mode = source._train_mode


def current_expected_place():
    """Paddle's current device (``framework._current_expected_place_``: stock or patched)."""
    resolve()  # the one reader that may come first: placeenv.current_place() before install
    return framework._current_expected_place_()


def set_expected_place(place) -> None:
    """Paddle's own device setter (``framework._set_expected_place``: stock or patched)."""
    framework._set_expected_place(place)


def first_use_place():
    """What stock Paddle picks when no device was set yet (its first-use detection)."""
    return stock["base.framework._current_expected_place_"]()


def paddle_place(device):
    """The place ``device=`` of the creation APIs means (``framework._get_paddle_place``)."""
    return framework._get_paddle_place(device)


# -- tensors and programs (placeenv.tensors, placeenv.fixes) ------------------


def empty_host(shape, dtype):
    """An uninitialised CPU tensor, without the eager constructor's argument parsing."""
    return C_ops_empty(shape, dtype, HOST)


def fill_host(tensor, array) -> None:
    """Copy a contiguous numpy ``array`` into the CPU ``tensor`` of its shape and dtype."""
    dense_tensor_set(tensor_get_tensor(tensor), array, HOST)


def view_host(array):
    """A CPU tensor over a contiguous numpy ``array``'s memory, no copy: the tensor holds the array."""
    tensor = C_ops_empty([0], convert_dtype(array.dtype), HOST)
    dense_tensor_set(tensor_get_tensor(tensor), array, HOST, True)
    return tensor


def copy_to(tensor, place):
    """A blocking copy of ``tensor`` on ``place``: where ``Tensor.to`` ends."""
    return tensor_copy_to(tensor, place, True)


def program_signature(layer):
    """A ``paddle.jit.load``ed layer's (input specs, output specs): name, dtype, shape each."""
    return jit_input_spec(layer), jit_output_spec(layer)


def cast_layer(layer, dtype) -> None:
    """Cast every parameter, gradient and buffer of ``layer`` to ``dtype`` in place (``Layer.to``'s cast)."""
    layer_to_impl(layer, dtype=dtype, floating_only=False)


def paddle_dtype(dtype):
    """Paddle's dtype for a numpy dtype or dtype name."""
    return convert_dtype(dtype)


# -- Paddle Inference's C++ run (placeenv.native) -----------------------------


@functools.cache
def _native_symbols() -> tuple[int, int] | None:
    """The addresses of ``Predictor::Run()`` and of AnalysisPredictor's vtable in the loaded library."""
    resolve()
    if libpaddle is None or InferPredictor is None:
        return None
    try:
        library = ctypes.CDLL(libpaddle.__file__, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        run = ctypes.cast(library[PREDICTOR_RUN_SYMBOL], ctypes.c_void_p).value
        vtable = ctypes.addressof(ctypes.c_char.in_dll(library, ANALYSIS_PREDICTOR_VTABLE))
    except (AttributeError, OSError, ValueError):
        return None
    return run, vtable


def predictor_run_entry() -> int | None:
    """The address of ``bool paddle_infer::Predictor::Run()``, or None where the library lacks it."""
    found = _native_symbols()
    return None if found is None else found[0]


def native_predictor(predictor) -> int | None:
    """The ``paddle_infer::Predictor*`` behind a Python Predictor, or None where it cannot be found.

    pybind11 keeps a singly-held instance's C++ pointer right after the object's header. The pointer is
    checked before it is used: a ``paddle_infer::Predictor``'s one member points to the AnalysisPredictor,
    whose first word is its vtable's address point (two words into AnalysisPredictor's vtable)."""
    found = _native_symbols()
    if found is None or type(predictor) is not InferPredictor:
        return None
    word = ctypes.c_void_p.from_address
    address = word(id(predictor) + object.__basicsize__).value
    inner = word(address).value if address else None
    if not inner or word(inner).value != found[1] + 2 * ctypes.sizeof(ctypes.c_void_p):
        return None
    return address


# -- replacement bodies (run with the replaced function's module as their globals) --
# The _placeenv_* names are injected into those modules' globals by the patch.


def injections(**helpers) -> dict:
    """The globals the replacement bodies read, by name: placeenv's ``helpers`` (``own=...``,
    ``attach_guard=...``, ...) as ``_placeenv_<name>``, and the stock functions some of them wrap."""
    names = {f"_placeenv_{name}": helper for name, helper in helpers.items()}
    names["_placeenv_stock_set_device"] = stock["device.set_device"]
    names["_placeenv_stock_get_paddle_place"] = stock["base.framework._get_paddle_place"]
    names["_placeenv_stock_full_like"] = stock["tensor.creation.full_like"]
    return names


def _current_expected_place_():
    scope = _placeenv_own()  # noqa: F821 - the override ContextVar's bound get
    if scope is None:
        # Installed, the global device is None (not chosen yet) or a concrete
        # place: placeenv.state is its only writer, and never stores the
        # generic core.Place that stock Paddle also treats as "not chosen".
        place = _global_expected_place_  # noqa: F821
        return _placeenv_init_global() if place is None else place  # noqa: F821
    return scope.place


def _set_expected_place(place):
    _placeenv_set_place(place)  # noqa: F821


def _dygraph_place_guard(place):
    token = _placeenv_attach_guard(place)  # noqa: F821
    try:
        yield
    finally:
        _placeenv_detach(token)  # noqa: F821


def __setattr__(self, name, val):
    if name == "_dygraph_tracer_":
        _placeenv_tracer_switched(val)  # noqa: F821
        core._switch_tracer(val)  # noqa: F821
    self.__dict__[name] = val


def set_device(device):
    try:
        return _placeenv_stock_set_device(device)  # noqa: F821
    except ValueError as error:
        _placeenv_explain_device(device, error)  # noqa: F821 - raises a clearer error, or returns
        raise


def _get_paddle_place(place):
    try:
        return _placeenv_stock_get_paddle_place(place)  # noqa: F821
    except AttributeError:
        _placeenv_explain_place(place)  # noqa: F821 - raises the ValueError Paddle meant, or returns
        raise


def full_like(x, fill_value, dtype=None, name=None, *, device=None, requires_grad=False, pin_memory=False):
    out = _placeenv_stock_full_like(  # noqa: F821
        x, fill_value, dtype, name, device=device, requires_grad=requires_grad, pin_memory=pin_memory
    )
    return out if device is None or pin_memory else _placeenv_land(out, device)  # noqa: F821


REPLACEMENTS = {
    "base.framework._current_expected_place_": _current_expected_place_,
    "base.framework._set_expected_place": _set_expected_place,
    "base.framework._dygraph_place_guard": _dygraph_place_guard,
    "base.framework.GlobalThreadLocal.__setattr__": __setattr__,
    "device.set_device": set_device,
    "base.framework._get_paddle_place": _get_paddle_place,
    "tensor.creation.full_like": full_like,
}
