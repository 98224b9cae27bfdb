"""Per-thread, per-task device state, on both of Paddle's levels.

The model, in two lines:

* The **global** device (Paddle's own, and the shared Tracer's) is the main
  thread's device, exactly as in stock Paddle. Every context with no device of
  its own follows it live.
* A **scope** lives in a ContextVar, so it belongs to one thread, or to one
  asyncio task. A context with a scope runs on a private Tracer that carries
  the scope's device, so Paddle's C++ side (which reads the calling thread's
  Tracer) agrees with the Python side.

Every way in and out of a scope is one pair, :func:`push` and :func:`pop`, as
OpenTelemetry's attach/detach: ``PlaceEnv``, Paddle's own guards, decorated
generators and coroutines (each step resumes the body's own scope), and
``paddle.set_device`` off the bare main thread (a push that is never popped;
inside a scope it changes that scope's device). ``paddle.set_device`` on the
main thread outside any scope moves the global device (stock behaviour).

Nothing here names a Paddle internal: :mod:`placeenv._internals` does.
"""

from __future__ import annotations

import threading
import weakref
from contextvars import ContextVar
from threading import get_ident

from . import _internals as _pd
from .places import canonical

#: A scope, and the token that ends it: the tuple ``(place, outer, undo)``.
#: ``place`` is its device; ``outer`` the scope :func:`pop` returns to (None:
#: follow the main thread; :data:`UNSCOPED`: none was changed); ``undo`` what
#: else :func:`pop` does: :data:`KEPT`, :data:`RETARGET`, or else the global
#: device to put back (None or a place).
#: A plain tuple: frozen, and the cheapest object to make on the hot path.
Token = tuple

#: This context's innermost scope (a :data:`Token`), or None to follow the main thread.
override: ContextVar = ContextVar("placeenv_override", default=None)

#: ``undo``: the scope kept the device it found, so leaving it changes nothing.
KEPT = object()
#: ``undo``: leaving the scope re-aims the thread's Tracer at the outer device.
RETARGET = object()
#: ``outer`` of a token that changed no scope: a guard that moved the global device.
UNSCOPED = object()
#: ``push(place, GUARD)``: a scope for Paddle's own guards.
GUARD = object()
_MAIN = threading.main_thread().ident

#: True while installed. Uninstalled, a scope does what Paddle's own guard does
#: (swap the global device, put it back after): stock semantics, leaks included.
enabled = False


class _Thread(threading.local):
    """The calling thread's Tracer, as placeenv left it."""

    #: The place this thread's private Tracer carries; None while the thread
    #: runs on a Tracer of Paddle's own (the shared one, or one Paddle switched
    #: to); RELEASED while it runs on a private Tracer that uninstall() released.
    aimed = None
    #: The Tracer of Paddle's own that the thread left for its first private one.
    base = None
    #: ``{id(canonical place): private Tracer}``: one per device the thread used,
    #: since switching to a kept Tracer is cheaper than re-aiming one.
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
    place = canonical(_pd.first_use_place())
    _pd.set_global_place(place)
    return place


def current():
    """The device of the calling thread/task."""
    if not enabled:
        return _pd.current_expected_place()
    token = override.get()
    if token is None:
        place = _pd.global_place()
        return init_global() if place is None else place
    return token[0]


def own_place():
    """The calling context's own device, or None when it follows the main thread."""
    token = override.get()
    return None if token is None else token[0]


# -- scopes ------------------------------------------------------------------


def push(place, via=None) -> Token:
    """Make ``place`` (canonical) the calling context's device until :func:`pop` of the token returned.

    ``via`` says who asks, when it is not a plain scope (``PlaceEnv``, ``set_device``):

    * :data:`GUARD`, Paddle's own guards. On the bare main thread they move the
      global device instead, as stock Paddle's do (``paddle.disable_static``
      holds one open for the whole program, and threads that follow the main
      thread follow it); elsewhere they always re-aim the Tracer, since Paddle
      may have just switched the thread to a fresh Tracer of its own
      (``dygraph.guard``).
    * a suspended body's scope (:func:`scope` at the end of its last step; its
      device is ``place``), installed as it was, inner scopes and all, instead
      of a new one: how decorated generators and coroutines step.

    ``via`` is positional, and the plain scope is checked first: this is every
    ``with PlaceEnv``'s way in.
    """
    outer = override.get()
    if not enabled:  # stock Paddle: every scope swaps the one global device
        previous = _pd.current_expected_place()
        _pd.set_expected_place(place)
        if via is GUARD:
            return (place, UNSCOPED, previous)
        token = (place, outer, previous)
        override.set(token)
        return token
    if via is None:
        if outer is None:
            # A child thread that follows the main thread has no device of its own to keep.
            kept = get_ident() == _MAIN and place is _pd.global_place()
        else:
            kept = place is outer[0]
        if kept:
            token = (place, outer, KEPT)
            override.set(token)
            return token
    elif via is GUARD:
        if outer is None and get_ident() == _MAIN:
            token = (place, UNSCOPED, _pd.global_place())
            set_global(place)
            return token
    else:  # resume a body's scope
        override.set(via)
        sync_tracer(place)
        return (place, outer, RETARGET)
    token = (place, outer, RETARGET)
    override.set(token)
    sync_tracer(place)
    return token


def pop(token: Token) -> None:
    """End the scope ``token`` opened: the context returns to the scope it had before.

    ``token`` is the context's innermost scope (a ``paddle.set_device`` inside
    a scope replaces its token: pop the replacement, as ``PlaceEnv`` does), or
    the token of a resumed step. A token kept across ``install()`` or
    ``uninstall()`` still ends its scope cleanly: it says how to undo itself.
    """
    _, outer, undo = token
    if undo is KEPT:
        override.set(outer)
        return
    if outer is UNSCOPED:  # a guard that moved the global device, and no scope
        _restore_global(undo)
        return
    override.set(outer)
    if undo is not RETARGET:  # the scope moved the global device: put it back
        _restore_global(undo)
    sync_tracer(None if outer is None else outer[0])


def scope() -> Token | None:
    """The calling context's innermost scope: what a suspended body resumes at its next step.

    Stock Paddle keeps no scopes, only the global device: uninstalled, a scope of just that.
    """
    if not enabled:
        return (_pd.current_expected_place(), None, RETARGET)
    return override.get()


def _restore_global(place) -> None:
    # Installed, or the device was not chosen yet: placeenv's setter (stock's would aim a
    # Tracer at None); uninstalled, stock Paddle's own.
    if enabled or place is None:
        set_global(place)
    else:
        _pd.set_expected_place(place)


def set_place(place) -> None:
    """What ``paddle.set_device`` does: global on the bare main thread, else the innermost scope's device."""
    place = canonical(place)
    token = override.get()
    if token is None:
        if get_ident() == _MAIN:
            set_global(place)
        else:
            push(place)  # never popped: the thread's own device from now on
        return
    _, outer, undo = token
    override.set((place, outer, RETARGET if undo is KEPT else undo))
    sync_tracer(place)


def set_global(place) -> None:
    """Move the global device (the main thread's, which threads without their own follow)."""
    if place is not None:
        place = canonical(place)
        if type(place) is _pd.Place:  # a generic, undefined place: Paddle's "not chosen yet"
            place = None
    _pd.set_global_place(place)
    tracer = _pd.shared_tracer()  # the main thread's: the one the global device lives on
    if tracer is not None and place is not None:
        _pd.aim(tracer, place)


# -- the C++ level: one Tracer per thread ------------------------------------


def sync_tracer(place) -> None:
    """Aim the calling thread's C++ Tracer at ``place`` (None: the main thread's device)."""
    if not enabled:  # stock Paddle: every thread on a Tracer of Paddle's own
        restore_thread()
        return
    thread = _current_record()
    if place is not None and place is _pd.global_place() and get_ident() == _MAIN:
        # The main thread's own Tracer carries the global device, and only the
        # main thread outside any scope moves it: run on it.
        place = None
    if thread.aimed is not place:
        _switch(thread, place)


def _switch(thread: _Thread, place) -> None:
    active = _pd.thread_tracer()
    if active is None:  # static mode: no Tracer to aim
        return
    if place is None:
        restore_thread()
        return
    if thread.aimed is None and thread.base is None:  # leaving Paddle's Tracer: come back to it later
        thread.base = active
    tracers = thread.tracers
    if tracers is None:
        tracers = thread.tracers = {}
    tracer = tracers.get(id(place))
    if tracer is None:
        tracer = tracers[id(place)] = _pd.new_tracer(place)
        with _private_lock:
            _private[tracer] = place
    # AMP state (auto_cast's level, dtype and op lists) is not carried: reading
    # it costs more than the switch; a scope runs an auto_cast entered inside it
    # (docs/library.md, known limits).
    _pd.carry_train_mode(active, tracer)
    _pd.activate(tracer)
    thread.aimed = place


def tracer_switched(tracer) -> None:
    """Paddle code switched the calling thread's Tracer.

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
        _pd.set_shared_tracer(tracer if place is None else thread.base or _pd.shared_tracer())


def restore_thread() -> None:
    """Put the calling thread back on the Tracer of Paddle's own it left for its own device."""
    thread = _current_record()
    if thread.aimed is not None:
        _pd.activate(thread.base or _pd.shared_tracer())
    thread.base = thread.aimed = None


def release_private_tracers(place) -> None:
    """uninstall(): aim every private Tracer at ``place``, since stock Paddle has one device for
    all threads, and make every thread's record of its Tracers stale."""
    global _epoch
    with _private_lock:
        tracers = list(_private.keys())
        _private.clear()
    for tracer in tracers:
        _pd.aim(tracer, place)
    _epoch += 1
