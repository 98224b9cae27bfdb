"""Per-thread, per-task device state, on both of Paddle's levels.

The model, in two lines:

* The **global** device (``framework._global_expected_place_``, and the
  shared Tracer's ``_expected_place``) is the main thread's device, exactly as
  in stock Paddle. Every context with no device of its own follows it live.
* An **override** lives in a ContextVar, so it belongs to one thread, or to one
  asyncio task. Its value is a node ``(place, outer node)``: the innermost
  scope's device, and what to return to when that scope ends. A context with
  an override runs on a private Tracer whose ``_expected_place`` carries it,
  so Paddle's C++ side (which reads the calling thread's Tracer) agrees with
  the Python side.

``paddle.set_device`` on the main thread, outside any ``PlaceEnv``, moves the
global device (stock behaviour); anywhere else it sets the override.
"""

from __future__ import annotations

import threading
from threading import get_ident
from contextvars import ContextVar

from . import _internals as _pd
from .places import canonical, is_canonical, normalize

_framework = _pd.FRAMEWORK
_global_var = _pd.global_var
_switch_tracer = _pd.switch_tracer

#: This context's device scopes: ``(place, outer node)``, or None to follow the main thread.
override: ContextVar = ContextVar("placeenv_override", default=None)
#: Restore tokens of Paddle's own guards (paddle.device.device, ...), which cannot
#: keep them on their shared instances: a linked list ``(token, rest)``.
guards: ContextVar = ContextVar("placeenv_guards", default=None)

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
    place = _framework._global_expected_place_ = canonical(_stock_current())
    return place


def current():
    """The device of the calling thread/task."""
    node = override.get()
    if node is None:
        place = _framework._global_expected_place_
        if place is None or type(place) is _pd.core.Place:
            place = init_global()
        return place
    return node[0]


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
    if type(active) is not _private:  # on Paddle's own Tracer (or none: static mode)
        if place is None or active is None:
            return
        if place is _framework._global_expected_place_ and get_ident() == _MAIN:
            # The main thread's own Tracer already carries ``place``, and only the
            # main thread outside any scope can re-aim it: nothing to switch.
            return
        td = _local.__dict__
        td["base"] = active
    else:
        td = _local.__dict__
        if place is None:
            tracer = td.get("base") or _framework._dygraph_tracer_
            td["base"] = None
            gd["_dygraph_tracer_"] = tracer
            _switch_tracer(tracer)
            return
    tracer = td.get(id(place)) or _private_tracer(td, place, active)
    if active is not tracer:
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
    if place is not None:
        place = canonical(place)  # so sync_tracer can compare by identity
    _framework._global_expected_place_ = place
    tracer = _global_var.__dict__.get("_dygraph_tracer_")
    if tracer is not None and place is not None:
        tracer._expected_place = place


def own_place():
    """The calling context's own device, or None when it follows the main thread."""
    node = override.get()
    return None if node is None else node[0]


def set_place(place) -> None:
    """What ``paddle.set_device`` does: global on the bare main thread, else the innermost scope."""
    place = normalize(place)
    node = override.get()
    if node is None and get_ident() == _MAIN:
        _set_global(place)
        return
    override.set((place, None if node is None else node[1]))
    sync_tracer(place)


def push(place):
    """Enter a temporary device for Paddle's own guards; returns a token for :func:`pop`.

    On the bare main thread this swaps the global device, as stock Paddle's
    guards do (``paddle.disable_static`` holds one open for the whole program);
    elsewhere it is scoped to the context.
    """
    place = normalize(place)
    node = override.get()
    if node is None and get_ident() == _MAIN:
        previous = _framework._global_expected_place_
        _set_global(place)
        return (_GLOBAL, previous)
    token = override.set((place, node))
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
    elif kind is _STOCK:
        _framework._set_expected_place(value)
    else:
        override.reset(value)
        sync_tracer(own_place())


def enter_guard(place) -> None:
    """:func:`push`, with the token kept on the context's guard stack."""
    guards.set((push(place) if enabled else _push_stock(place), guards.get()))


def leave_guard() -> None:
    token, rest = guards.get()
    guards.set(rest)
    pop(token)


def enter(place, _get=override.get, _set=override.set) -> None:
    """Make ``place`` this context's device until :func:`leave` (PlaceEnv: scoped everywhere)."""
    if enabled:
        _set((place, _get()))
        sync_tracer(place)
    else:
        enter_guard(place)


def leave(_get=override.get, _set=override.set) -> None:
    """End the innermost :func:`enter` of this context."""
    if enabled:
        outer = _get()[1]
        _set(outer)
        sync_tracer(None if outer is None else outer[0])
    else:
        leave_guard()


def step_in(node):
    """Resume a suspended body (decorated generator or coroutine) with its own scope ``node``."""
    if not enabled:
        return _push_stock(node[0])
    token = override.set(node)
    sync_tracer(node[0])
    return token


def step_out(token):
    """Suspend the body: returns its scope node and restores the caller's."""
    if type(token) is tuple:  # uninstalled: Paddle's own set/restore
        node = (_framework._current_expected_place_(), None)
        pop(token)
        return node
    node = override.get()
    override.reset(token)
    sync_tracer(own_place())
    return node


def restore_thread() -> None:
    """Put back the Tracer Paddle had installed in the calling thread (used by uninstall)."""
    sync_tracer(None)
