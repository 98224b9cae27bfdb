"""Per-thread, per-task device state, on both of Paddle's levels.

The model, in two lines:

* The **global** device (``framework._global_expected_place_``, and the
  shared Tracer's ``_expected_place``) is the main thread's device, exactly as
  in stock Paddle. Every context with no device of its own follows it live.
* An **override** lives in a ContextVar, so it belongs to one thread, or to one
  asyncio task. Its value is a node ``(place, outer node, undo)``: the
  innermost scope's device, what to return to when that scope ends, and how to
  undo it (:data:`PATCHED`: re-aim the Tracer; :data:`KEPT`: nothing, the scope
  kept the device it found; or the global device to restore, when it was
  entered on stock Paddle). A context with an override runs on a private
  Tracer whose ``_expected_place`` carries it, so Paddle's C++ side (which
  reads the calling thread's Tracer) agrees with the Python side.

``paddle.set_device`` on the main thread, outside any ``PlaceEnv``, moves the
global device (stock behaviour); anywhere else it sets the override.

Nothing here runs at import time that needs Paddle: the internals are read
from :mod:`placeenv._internals` when first used.
"""

from __future__ import annotations

import threading
import weakref
from contextvars import ContextVar
from threading import get_ident

from . import _internals as _pd
from .places import canonical

#: This context's device scopes: ``(place, outer node, undo)``, or None to follow the main thread.
override: ContextVar = ContextVar("placeenv_override", default=None)
#: Restore tokens of Paddle's own guards (paddle.device.device, ...), which cannot
#: keep them on their shared instances: a linked list ``(token, rest)``.
guards: ContextVar = ContextVar("placeenv_guards", default=None)

#: ``undo`` of a node entered while placeenv was installed: leaving it re-aims the Tracer.
PATCHED = object()
#: ``undo`` of a node entered on the device its context already had: leaving it changes nothing.
KEPT = object()
_MAIN = threading.main_thread().ident
_GLOBAL = object()  # guard token kind: the bare main thread changed the global device
_STOCK = object()  # guard token kind: placeenv is uninstalled, Paddle's own set/restore was used

#: True while installed. Uninstalled, PlaceEnv degrades to what Paddle's own
#: guard does (set the device, restore it after): stock semantics, leaks included.
enabled = False
_stock_current = None  # stock _current_expected_place_, set by the patch


class _Thread(threading.local):
    """The calling thread's Tracer, as placeenv left it."""

    #: The place this thread's private Tracer carries; None while the thread
    #: runs on a Tracer of Paddle's own (the shared one, or one Paddle switched
    #: to); RELEASED while it runs on a private Tracer that uninstall() released.
    aimed = None
    #: The Tracer of Paddle's own that the thread left for its first private one.
    base = None
    #: ``{id(canonical place): private Tracer}``: one per device the thread used,
    #: since re-aiming a Tracer costs more than switching to another one.
    tracers = None
    #: The uninstall() count this record was made under (see :func:`_current_record`).
    epoch = 0


_thread = _Thread()
#: Every live private Tracer -> the place it carries: how tracer_switched() tells
#: them from Paddle's own, and what private_tracers() counts.
_private: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_private_lock = threading.Lock()  # new Tracers (any thread) vs uninstall()'s snapshot
#: Bumped by uninstall(): the Tracers every thread's record names are released.
_epoch = 0
#: ``aimed`` of a thread still on a Tracer that uninstall() released (re-aimed at the global device).
RELEASED = object()


def private_tracers() -> int:
    """How many private Tracers are alive (a thread's own ones die with the thread)."""
    return len(_private)


def _current_record() -> _Thread:
    """The calling thread's record; after an uninstall(), its Tracers are forgotten (released)."""
    thread = _thread
    if thread.epoch != _epoch:
        thread.epoch, thread.tracers = _epoch, None
        if thread.aimed is not None:
            thread.aimed = RELEASED
    return thread


# -- reading -----------------------------------------------------------------


def init_global():
    """The global device, running Paddle's own first-use detection if unset."""
    place = _pd.framework._global_expected_place_ = canonical(_stock_current())
    return place


def current():
    """The device of the calling thread/task."""
    if not enabled:
        return _pd.framework._current_expected_place_()
    node = override.get()
    if node is None:
        place = _pd.framework._global_expected_place_
        return init_global() if place is None else place
    return node[0]


def own_place():
    """The calling context's own device, or None when it follows the main thread."""
    node = override.get()
    return None if node is None else node[0]


# -- the C++ level: one Tracer per thread ------------------------------------


def sync_tracer(place) -> None:
    """Aim the calling thread's C++ Tracer at ``place`` (None: the main thread's device)."""
    thread = _current_record()
    if place is not None and place is _pd.framework._global_expected_place_ and get_ident() == _MAIN:
        # The main thread's own Tracer carries the global device, and only the
        # main thread outside any scope moves it: run on it.
        place = None
    if thread.aimed is not place:
        _switch(thread, place)


def _switch(thread: _Thread, place) -> None:
    active = _pd.global_var.__dict__.get("_dygraph_tracer_")
    if active is None:  # static mode: no Tracer to aim
        return
    if place is None or not enabled:
        restore_thread()
        return
    if thread.aimed is None and thread.base is None:  # leaving Paddle's Tracer: come back to it later
        thread.base = active
    tracers = thread.tracers
    if tracers is None:
        tracers = thread.tracers = {}
    tracer = tracers.get(id(place))
    if tracer is None:
        tracer = tracers[id(place)] = _pd.Tracer()
        tracer._expected_place = place
        with _private_lock:
            _private[tracer] = place
    # Layer.train()/eval() set the mode on the thread's Tracer: carry it into the
    # thread's own. AMP state (auto_cast's level, dtype and op lists) is not
    # carried: reading it costs ~0.4 us a field, more than the switch; a scope
    # runs an auto_cast entered inside it (docs/library.md, known limits).
    tracer._train_mode = active._train_mode
    _activate(tracer)
    thread.aimed = place


def _activate(tracer) -> None:
    _pd.global_var.__dict__["_dygraph_tracer_"] = tracer  # not through the patched __setattr__
    _pd.switch_tracer(tracer)


def tracer_switched(tracer) -> None:
    """Paddle code set ``global_var._dygraph_tracer_`` in the calling thread.

    Stock Paddle then makes it the Tracer of every thread started later. Only
    the main thread's own (non-private) Tracer may play that role: a private
    Tracer stands in for the main thread's base, and other threads never do.
    """
    thread = _current_record()
    place = None if tracer is None else _private.get(tracer)
    # A Tracer of Paddle's own (a dygraph guard's; to_static runs on None for a
    # while), or Paddle restoring a private Tracer it had saved. ``base`` stays:
    # it is where the thread returns when its own device ends.
    thread.aimed = place
    if get_ident() == _MAIN:
        shared = _pd.framework._dygraph_tracer_
        _pd.framework._dygraph_tracer_ = tracer if place is None else thread.base or shared


def restore_thread() -> None:
    """Put the calling thread back on the Tracer of Paddle's own it left for its own device."""
    thread = _current_record()
    if thread.aimed is not None:
        _activate(thread.base or _pd.framework._dygraph_tracer_)
    thread.base = thread.aimed = None


def release_private_tracers(place) -> None:
    """uninstall(): aim every private Tracer at ``place``, since stock Paddle has one device for
    all threads, and make every thread's record of its Tracers stale."""
    global _epoch
    with _private_lock:
        tracers = list(_private.keys())
        _private.clear()
    for tracer in tracers:
        tracer._expected_place = place
    _epoch += 1


# -- writing -----------------------------------------------------------------


def set_global(place) -> None:
    """Move the global device (the main thread's, which threads without their own follow)."""
    if place is not None:
        place = canonical(place)
        if type(place) is _pd.Place:  # a generic, undefined place: Paddle's "not chosen yet"
            place = None
    _pd.framework._global_expected_place_ = place
    tracer = _pd.framework._dygraph_tracer_  # the main thread's: the one the global device lives on
    if tracer is not None and place is not None:
        tracer._expected_place = place


def set_place(place) -> None:
    """What ``paddle.set_device`` does: global on the bare main thread, else the innermost scope."""
    place = canonical(place)
    node = override.get()
    if node is None:
        if get_ident() == _MAIN:
            set_global(place)
            return
        override.set((place, None, PATCHED))
    else:
        override.set((place, node[1], PATCHED if node[2] is KEPT else node[2]))
    sync_tracer(place)


def enter(place) -> None:
    """Make ``place`` this context's device until :func:`leave` (PlaceEnv: scoped everywhere).

    The node remembers how to undo itself, so a scope left open across
    ``install()`` or ``uninstall()`` still exits cleanly.
    """
    outer = override.get()
    if not enabled:
        override.set((place, outer, _stock_set(place)))
        return
    # A scope on the device the context already has leaves the Tracer as it is.
    # (A child thread that follows the main thread has no device of its own to keep.)
    if outer is not None:
        kept = place is outer[0]
    else:
        kept = get_ident() == _MAIN and place is _pd.framework._global_expected_place_
    if kept:
        override.set((place, outer, KEPT))
    else:
        override.set((place, outer, PATCHED))
        sync_tracer(place)


def leave() -> None:
    """End the innermost :func:`enter` of this context."""
    _, outer, undo = override.get()
    override.set(outer)
    if undo is KEPT:
        return
    if undo is not PATCHED:  # entered on stock Paddle, which moved the global device
        if enabled:
            set_global(undo)
        else:
            _pd.framework._set_expected_place(undo)
    _resync()


def _resync() -> None:
    """The calling context's scope changed: aim the thread's Tracer at its device (uninstalled:
    back on Paddle's own)."""
    if enabled:
        sync_tracer(own_place())
    else:
        restore_thread()


def _stock_set(place):
    """Paddle's own set-and-remember (uninstalled); returns the device to restore."""
    previous = _pd.framework._current_expected_place_()
    _pd.framework._set_expected_place(place)
    return previous


def step_in(node):
    """Resume a suspended body (decorated generator or coroutine) with its own scope ``node``."""
    if not enabled:
        return (_STOCK, _stock_set(node[0]))
    token = override.set(node)
    sync_tracer(node[0])
    return token


def step_out(token):
    """Suspend the body: returns its scope node and restores the caller's."""
    if type(token) is tuple:  # entered uninstalled: Paddle's own set/restore
        node = (_pd.framework._current_expected_place_(), None, PATCHED)
        pop(token)
        return node
    node = override.get()
    override.reset(token)
    _resync()
    return node


# -- Paddle's own guards -----------------------------------------------------


def push(place):
    """Enter a temporary device for Paddle's own guards; returns a token for :func:`pop`.

    On the bare main thread this swaps the global device, as stock Paddle's
    guards do (``paddle.disable_static`` holds one open for the whole program);
    elsewhere it is scoped to the context.
    """
    place = canonical(place)
    node = override.get()
    if node is None and get_ident() == _MAIN:
        previous = _pd.framework._global_expected_place_
        set_global(place)
        return (_GLOBAL, previous)
    token = override.set((place, node, PATCHED))
    sync_tracer(place)
    return (override, token)


def pop(token) -> None:
    kind, value = token
    if kind is _GLOBAL:
        set_global(value)
    elif kind is _STOCK:
        _pd.framework._set_expected_place(value)
    else:
        override.reset(value)
        _resync()


def enter_guard(place) -> None:
    """:func:`push`, with the token kept on the context's guard stack."""
    guards.set((push(place) if enabled else (_STOCK, _stock_set(place)), guards.get()))


def leave_guard() -> None:
    token, rest = guards.get()
    guards.set(rest)
    pop(token)
