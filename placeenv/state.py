"""Per-thread, per-task device state, on both of Paddle's levels.

The model, in two lines:

* The **global** device (``framework._global_expected_place_``, and the
  shared Tracer's ``_expected_place``) is the main thread's device, exactly as
  in stock Paddle. Every context with no device of its own follows it live.
* An **override** lives in a ContextVar, so it belongs to one thread, or to one
  asyncio task. A context with an override runs on a private Tracer whose
  ``_expected_place`` carries it, so Paddle's C++ side (which reads the
  calling thread's Tracer) agrees with the Python side.

``paddle.set_device`` on the main thread, outside any ``PlaceEnv``, moves the
global device (stock behaviour); anywhere else it sets the override.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar, Token

from . import _internals as _pd
from .places import is_canonical, normalize

_framework = _pd.FRAMEWORK
_global_var = _pd.global_var
_switch_tracer = _pd.switch_tracer

#: The current context's own device; None means "follow the main thread".
override: ContextVar = ContextVar("placeenv_override", default=None)
#: Per-context stack of tokens for context managers that cannot keep state on
#: their instance (PlaceEnv, paddle.device.device, ...): a linked list of tuples.
scopes: ContextVar = ContextVar("placeenv_scopes", default=None)

_MAIN = threading.main_thread().ident
_GLOBAL = object()  # token kind: the main thread changed the global device
_STOCK = object()  # token kind: placeenv is uninstalled, Paddle's own set/restore was used

#: True while installed. Uninstalled, PlaceEnv degrades to what Paddle's own
#: guard does (set the device, restore it after): stock semantics, leaks included.
enabled = False


class PrivateTracer(_pd.Tracer):
    """A Tracer that carries one thread's own device."""


# Per-thread Tracer bookkeeping, in one plain dict per thread (hot path: one
# threading.local lookup). Keys: "base" -> the Tracer Paddle had installed
# before we switched to ours; id(canonical place) -> a PrivateTracer aimed at
# it once (setting Tracer._expected_place costs more than switching Tracers);
# "other"/"other_place" -> one re-aimable Tracer for any other place object.
_local = threading.local()
_stock_current = None  # stock _current_expected_place_, set by the patch


def init_global():
    """The global device, running Paddle's own first-use detection if unset."""
    return _stock_current()


def current():
    """The device of the calling thread/task."""
    place = override.get()
    if place is None:
        place = _framework._global_expected_place_
        if place is None or type(place) is _pd.core.Place:
            place = init_global()
    return place


def _new_tracer(like, place):
    tracer = PrivateTracer()
    tracer._train_mode = like._train_mode
    tracer._use_promote = like._use_promote
    tracer._expected_place = place
    return tracer


def _private_tracer(td, place, like):
    if is_canonical(place):
        tracer = td[id(place)] = _new_tracer(like, place)
        return tracer
    other = td.get("other")
    if other is None:
        other = td["other"] = _new_tracer(like, place)
    elif td.get("other_place") is not place:
        other._expected_place = place
    td["other_place"] = place
    return other


def sync_tracer(place, _gv=_global_var, _local=_local, _private=PrivateTracer) -> None:
    """Make the calling thread's C++ Tracer agree with ``place`` (None: follow main)."""
    if not enabled:
        return
    gd = _gv.__dict__
    active = gd.get("_dygraph_tracer_")
    td = _local.__dict__
    if place is None:
        base = td.get("base")
        if base is not None and type(active) is _private:
            td["base"] = None
            gd["_dygraph_tracer_"] = base
            _switch_tracer(base)
        return
    if active is None:  # static-graph mode: there is no Tracer to carry a place
        return
    tracer = td.get(id(place)) or _private_tracer(td, place, active)
    if active is not tracer:
        if type(active) is not _private:
            td["base"] = active
        gd["_dygraph_tracer_"] = tracer
        _switch_tracer(tracer)


def tracer_switched(tracer) -> None:
    """Paddle code set ``global_var._dygraph_tracer_`` in the calling thread.

    Stock Paddle then makes it the Tracer of every thread started later. Only
    the main thread's own (non-private) Tracer may play that role: a private
    Tracer stands in for the main thread's base, and other threads never do.
    """
    if threading.get_ident() == _MAIN:
        _framework._dygraph_tracer_ = _local.__dict__.get("base") if isinstance(tracer, PrivateTracer) else tracer


def _set_global(place) -> None:
    _framework._global_expected_place_ = place
    tracer = _global_var.__dict__.get("_dygraph_tracer_")
    if tracer is not None and place is not None:
        tracer._expected_place = place


def set_place(place) -> None:
    """What ``paddle.set_device`` does: global on the bare main thread, else per context."""
    place = normalize(place)
    if override.get() is None and threading.get_ident() == _MAIN:
        _set_global(place)
    else:
        override.set(place)
        sync_tracer(place)


def push(place):
    """Enter a temporary device; returns a token for :func:`pop`.

    On the bare main thread this swaps the global device, as stock Paddle's
    guards do (``paddle.disable_static`` holds one open for the whole program);
    elsewhere it is scoped to the context.
    """
    place = normalize(place)
    if override.get() is None and threading.get_ident() == _MAIN:
        previous = _framework._global_expected_place_
        _set_global(place)
        return (_GLOBAL, previous)
    token = override.set(place)
    sync_tracer(place)
    return (override, token)


def _push_stock(place):
    previous = _framework._current_expected_place_()
    _framework._set_expected_place(place)
    return (_STOCK, previous)


def pop(token) -> None:
    kind, value = token
    if kind is _GLOBAL:
        _set_global(value)
        return
    if kind is _STOCK:
        _framework._set_expected_place(value)
        return
    override.reset(value)
    sync_tracer(override.get())


def enter(place, _set=override.set, _stack=scopes.get, _restack=scopes.set) -> None:
    """Make ``place`` this context's device until :func:`leave` (PlaceEnv: scoped everywhere)."""
    _restack((_set(place) if enabled else _push_stock(place), _stack()))
    sync_tracer(place)


def enter_guard(place) -> None:
    """Like :func:`push`, with the token kept on the context's stack (Paddle's guards)."""
    scopes.set((push(place), scopes.get()))


def leave(_stack=scopes.get, _restack=scopes.set, _reset=override.reset, _missing=Token.MISSING) -> None:
    """Undo the innermost :func:`enter` or :func:`enter_guard` of this context."""
    token, rest = _stack()
    _restack(rest)
    if type(token) is tuple:  # from enter_guard
        pop(token)
        return
    _reset(token)
    previous = token.old_value
    sync_tracer(None if previous is _missing else previous)


def step_in(place, stack):
    """Activate a suspended body's device and scope stack (decorated generators, coroutines)."""
    if not enabled:
        return _push_stock(place)
    tokens = override.set(place), scopes.set(stack)
    sync_tracer(place)
    return tokens


def step_out(tokens):
    """Suspend the body: returns its device and scope stack, restores the caller's."""
    if tokens[0] is _STOCK:
        place = _framework._current_expected_place_()
        pop(tokens)
        return place, None
    place, stack = override.get(), scopes.get()
    scopes.reset(tokens[1])
    override.reset(tokens[0])
    sync_tracer(override.get())
    return place, stack


def restore_thread() -> None:
    """Put back the Tracer Paddle had installed in the calling thread (used by uninstall)."""
    sync_tracer(None)
