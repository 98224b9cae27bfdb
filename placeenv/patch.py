"""Installing placeenv into the imported Paddle, and taking it out again exactly."""

from __future__ import annotations

import threading
import types

from . import _internals as _pd
from . import state
from .env import PlaceEnv
from .places import to_place

__all__ = ["install", "installed", "uninstall"]

_lock = threading.RLock()
_saved: dict | None = None  # what install replaced; None when not installed


def _guard_target(guard):
    if isinstance(guard, _pd.paddle.device.Device):
        return to_place(str(guard))
    if isinstance(guard, _pd.paddle.device.device_guard):
        return guard._target_place
    return guard.place  # paddle.device.device / paddle.cuda.device


def _guard_enter(self):
    # Paddle keeps the previous device on the instance (device) or on a
    # class-level stack (Device); both are shared between threads.
    state.enter_guard(_guard_target(self))
    return self if isinstance(self, _pd.paddle.device.Device) else None


def _guard_exit(self, exc_type, exc, tb):
    state.leave_guard()
    return False


def _injected() -> dict:
    return {
        "_placeenv_own": state.override.get,
        "_placeenv_init_global": state.init_global,
        "_placeenv_set_place": state.set_place,
        "_placeenv_push": state.push,
        "_placeenv_pop": state.pop,
        "_placeenv_tracer_switched": state.tracer_switched,
    }


def install() -> None:
    """Make Paddle's device per thread and per asyncio task. Idempotent.

    Threads that already touched Paddle need nothing: until they set a device
    of their own they share the main thread's Tracer, which is exactly the
    "follow the main thread" state.
    """
    global _saved
    with _lock:
        if _saved is not None:
            return
        _pd.check_version()
        framework = _pd.FRAMEWORK
        saved = {"code": {}, "methods": {}, "aliases": {}}
        for name in _pd.CODE_TARGETS:
            owner = _pd.code_owner(name)
            saved["code"][name] = owner.__code__
        state._stock_current = types.FunctionType(
            saved["code"]["_current_expected_place_"], framework.__dict__, "_stock_current_expected_place_"
        )
        framework.__dict__.update(_injected())
        for name, code in saved["code"].items():
            _pd.code_owner(name).__code__ = _pd.REPLACEMENTS[name].__code__
        for cls in _pd.GUARD_CLASSES:
            saved["methods"][cls] = (cls.__dict__["__enter__"], cls.__dict__["__exit__"])
            cls.__enter__, cls.__exit__ = _guard_enter, _guard_exit
        for module, attr in _pd.ALIASES:
            saved["aliases"][(module, attr)] = module.__dict__.get(attr, _MISSING)
            setattr(module, attr, PlaceEnv)
        _saved = saved
        state.enabled = True


def uninstall() -> None:
    """Restore stock Paddle: the original function code, methods and attributes.

    Threads still running that had a device of their own keep their private
    Tracer until they end; Paddle code no longer reads placeenv's state.
    """
    global _saved
    with _lock:
        if _saved is None:
            return
        saved, _saved = _saved, None
        state.restore_thread()
        state.enabled = False
        framework = _pd.FRAMEWORK
        for name, code in saved["code"].items():
            _pd.code_owner(name).__code__ = code
        for name in _injected():
            framework.__dict__.pop(name, None)
        for cls, (enter, exit_) in saved["methods"].items():
            cls.__enter__, cls.__exit__ = enter, exit_
        for (module, attr), value in saved["aliases"].items():
            if value is _MISSING:
                delattr(module, attr)
            else:
                setattr(module, attr, value)
        state.override.set(None)
        state.guards.set(None)


def installed() -> bool:
    return _saved is not None


_MISSING = object()
