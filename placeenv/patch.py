"""Installing placeenv into the imported Paddle, and taking it out again exactly."""

from __future__ import annotations

import sys
import threading
from contextvars import ContextVar

import numpy as np

from . import _internals as _pd
from . import fixes, state
from .env import PlaceEnv
from .places import canonical, device_name, explain_device, to_place

__all__ = ["install", "installed", "uninstall"]

_lock = threading.RLock()
_saved: dict | None = None  # what install replaced; None when not installed
_MISSING = object()
#: The tokens of Paddle's own guards open in this context, innermost first, as a
#: linked list ``(token, rest)``: the guards' instances are shared between threads.
_guard_tokens: ContextVar = ContextVar("placeenv_guards", default=None)


def _guard_attach(place, origin=None):
    """A scope for Paddle's own guards (``state.attach_guard``)."""
    return state.attach_guard(canonical(place), origin)


def _guard_enter(self):
    # Paddle keeps the previous device on the instance (device) or on a
    # class-level stack (Device); both are shared between threads.
    attr = next(attr for cls, attr in _pd.guard_classes if isinstance(self, cls))
    token = _guard_attach(to_place(str(self)) if attr is None else getattr(self, attr), self)
    _guard_tokens.set((token, _guard_tokens.get()))
    return self if attr is None else None  # as stock: only paddle.device('x') returns itself


def _guard_exit(self, exc_type, exc, tb):
    guards = _guard_tokens.get()
    if guards is None or guards[0].origin is not self:
        # The instance is shared: the innermost guard of this context must be one it entered.
        innermost = "none is open" if guards is None else (
            f"the innermost one is {_guard_name(guards[0].origin)} on {device_name(guards[0].place)}")
        raise state.ScopeError(
            f"{_guard_name(self)}.__exit__: it is not the innermost device guard open in this thread or task "
            f"(an exit out of order, a second exit, or an exit in another thread or task); {innermost} "
            f"(nothing was changed)"
        )
    token, rest = guards
    state.detach(token)  # first: if it raises, the guards stay as they were
    _guard_tokens.set(rest)
    return False


def _guard_name(guard) -> str:
    name = f"paddle.device.{type(guard).__name__}"
    return f"{name}({str(guard)!r})" if isinstance(guard, str) else name


def _injected() -> dict:
    return _pd.injections(
        own=state.override.get,
        init_global=state.init_global,
        set_place=state.set_place,
        attach_guard=_guard_attach,
        detach=state.detach,
        tracer_switched=state.tracer_switched,
        explain_device=explain_device,
        explain_place=fixes.explain_place,
        land=fixes.land,
    )


def install() -> None:
    """Make Paddle's device per thread and per asyncio task. Idempotent.

    Imports Paddle if it is not imported yet. Threads that already touched
    Paddle need nothing: until they set a device of their own they share the
    main thread's Tracer, which is exactly the "follow the main thread" state.
    """
    global _saved
    _pd.resolve()  # outside the lock: importing Paddle may run the import hook's install()
    with _lock:
        if _saved is not None:
            return
        _disarm_import_hook()
        # The stock code objects need no saving: _pd.stock's copies, made at resolve, hold them.
        _saved = saved = {"methods": {}, "aliases": {}}
        injected = saved["injected"] = _injected()
        for path in _pd.CODE_TARGETS:
            owner = _pd.code_owner(path)
            owner.__globals__.update(injected)
            owner.__code__ = _pd.REPLACEMENTS[path].__code__
        for cls, _ in _pd.guard_classes:
            saved["methods"][(cls, "__enter__")] = cls.__dict__["__enter__"]
            saved["methods"][(cls, "__exit__")] = cls.__dict__["__exit__"]
            cls.__enter__, cls.__exit__ = _guard_enter, _guard_exit
        for cls, name in _pd.method_targets:
            saved["methods"][(cls, name)] = cls.__dict__[name]
        fixes.install()
        for module, attr in _pd.aliases:
            saved["aliases"][(module, attr)] = module.__dict__.get(attr, _MISSING)
            setattr(module, attr, PlaceEnv)
        # Whatever the main thread set before install is the global device.
        state.set_global(_pd.global_place())
        _make_custom_device_generators()
        state.enable()
        _make_custom_device_event_pools()


def prepare_devices() -> None:
    """Create every custom device's random generator and its type's event pool now, in this thread.

    Paddle creates each on a device's first use, in a static map with no lock, so threads first
    using devices at once can fail or corrupt memory (see the two functions below). ``install()``
    does this; a program that runs stock Paddle on several threads (``uninstall()``, or the
    service's isolation off) calls it itself, before its threads start. It leaves no other trace:
    the mode, the device, the programs and the scope stay as they are.
    """
    _pd.resolve()
    _make_custom_device_generators()
    _make_custom_device_event_pools()


def _make_custom_device_generators() -> None:
    """Create every custom device's random generator now, in one thread.

    Paddle creates it on the device's first use, in a static map with no lock
    (``phi::DefaultCustomDeviceGenerator``; CUDA's and XPU's use ``call_once``).
    Two threads first using two custom devices at once can corrupt that map and
    fail with ``Required generator shall not be nullptr``, and per-thread devices
    make that the usual start of a multi-device program. ``paddle.seed()``
    creates the same generators; uninstall() leaves them, as it would leave
    generators made by use.
    """
    for kind in _pd.custom_device_types() or ():
        for index in range(_pd.custom_device_count(kind)):
            _pd.custom_device_generator(_pd.CustomPlace(kind, index))


def _make_custom_device_event_pools() -> None:
    """Create every custom device type's event pool now, in one thread.

    A compiled program's first run (``paddle.jit.load``ed, ``to_static`` or a static
    program's) makes the pool of its device type, for all its devices, in a static map with
    no lock (``CustomDeviceEventResourcePool::Instance``). Two threads first running
    programs at once see the type's entry before it is filled and fail with ``Device id
    is out of range, device id shall be less than 0``, or corrupt the heap. One tiny static
    program run per type makes the pools: built in programs and a scope of its own, in
    static mode for this thread only, so the user's programs, scope and mode stay as they
    are (``to_static`` would also write its converted source under ``~/.cache``).
    uninstall() leaves the pools, as it would leave pools made by use.
    """
    kinds = [kind for kind in _pd.custom_device_types() or () if _pd.custom_device_count(kind)]
    if not kinds:
        return
    paddle = _pd.paddle
    with _pd.dygraph_guard(None):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            doubled = paddle.static.data("x", [1], "float32") * 2
        for kind in kinds:
            paddle.static.Executor(_pd.CustomPlace(kind, 0)).run(
                main, feed={"x": np.ones([1], np.float32)}, fetch_list=[doubled], scope=paddle.static.Scope())


def uninstall() -> None:
    """Restore stock Paddle: the original function code, methods and attributes.

    After it, Paddle has one device for all threads again: the global device.

    * The calling thread, and every thread that follows the main thread, run on
      stock Paddle at once.
    * A ``PlaceEnv`` scope (or decorated function) still open in any thread
      exits cleanly: it restores what it changed, and its thread goes back to
      Paddle's shared Tracer.
    * A thread that set a device of its own with ``paddle.set_device`` keeps its
      private Tracer until it ends; that Tracer is re-aimed here at the global
      device, so both of Paddle's levels agree in that thread. It does not see
      a later ``paddle.set_device`` of another thread on Paddle's C++ level
      (the Python level follows it as usual), so call uninstall() when such
      threads are done, or have them call ``paddle.set_device`` again.

    uninstall() swaps code objects back: call it while no other thread is
    inside a Paddle call (threads may be alive, and hold devices, as above).

    If Paddle is not imported yet, this only keeps ``import paddle`` from
    installing placeenv.
    """
    global _saved
    with _lock:
        _disarm_import_hook()
        if _saved is None:
            return
        saved = _saved
        state.enabled = False
        try:
            state.restore_thread()
            for path, stock in _pd.stock.items():
                owner = _pd.code_owner(path)
                owner.__code__ = stock.__code__
                for name in saved["injected"]:
                    owner.__globals__.pop(name, None)
            for (cls, name), method in saved["methods"].items():
                setattr(cls, name, method)
            for (module, attr), value in saved["aliases"].items():
                if value is _MISSING:
                    delattr(module, attr)
                else:
                    setattr(module, attr, value)
            state.release_private_tracers(state.current())
        finally:
            _saved = None


def installed() -> bool:
    return _saved is not None


def _disarm_import_hook() -> None:
    package = sys.modules.get("placeenv")
    if package is not None:
        package._disarm()
