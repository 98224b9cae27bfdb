"""Per-thread, per-task device state, on both of Paddle's levels.

The model, in two lines:

* The **global** device (Paddle's own, and the shared Tracer's) is the main
  thread's device, exactly as in stock Paddle. Every context with no device of
  its own follows it live.
* A **scope** lives in a ContextVar, so it belongs to one thread, or to one
  asyncio task. A context with a scope runs on a private Tracer that carries
  the scope's device, so Paddle's C++ side (which reads the calling thread's
  Tracer) agrees with the Python side.

Every way into a scope returns a token (a :class:`Scope`), and one way out,
:func:`detach`, ends it with that token, as OpenTelemetry's attach/detach and
``ContextVar.reset``: :func:`attach` (``paddle.set_device`` off the bare main
thread, decorated functions), :func:`attach_guard` (Paddle's own guards), and
:func:`resume` (each step of a decorated generator or coroutine resumes the
body's own scope). ``PlaceEnv`` instances are shared between threads, so a
``with PlaceEnv`` keeps its token in the context itself: the innermost scope,
which :func:`leave` ends after checking that the ``PlaceEnv`` exiting is the one
that entered it. An exit that does not match the context's innermost scope
raises :class:`ScopeError` and changes nothing. ``paddle.set_device`` inside a
scope changes that scope's device; on the bare main thread outside any scope it
moves the global device (stock behaviour).

Nothing here names a Paddle internal: :mod:`placeenv._internals` does.
"""

from __future__ import annotations

import threading
import weakref
from contextvars import ContextVar
from threading import get_ident
from typing import final

from . import _internals as _pd
from .places import canonical, device_name


@final
class Scope:
    """A scope of one context, and the token that ends it.

    ``place`` is its device; ``outer`` the scope the context returns to when it
    ends (None: follow the main thread; :data:`UNSCOPED`: the token changed no
    scope); ``undo`` what else ending it does: :data:`KEPT`, :data:`RETARGET`,
    or else the global device to put back (None or a place).

    ``origin`` is what the exit is checked against. For a scope as it was
    opened, its opener: the ``PlaceEnv`` or Paddle guard that entered it, None
    when the token alone ends it, :data:`RESUMED` for the token of a resumed
    step. A ``paddle.set_device`` inside a scope replaces it with a scope on the
    new device whose ``origin`` is the scope it stands for, so the token (or the
    ``PlaceEnv``) that opened the scope still ends it.

    Why a replacement and not a change in place: a context copied inside the
    scope (a task, :func:`placeenv.bind`, ``asyncio.to_thread``) holds the same
    scope object, and a ``set_device`` in the copy must not move the original.
    Scopes are therefore never changed once made, except ``used``, which only
    the error messages read.

    ``ctx`` is the ``contextvars.Token`` of the ContextVar set that opened the
    scope: ending it resets the ContextVar with it. ``used`` is set when
    :func:`detach` has ended the token. The tokens of ``PlaceEnv`` and
    :func:`attach` leave it unset until then, since their way in is on every
    request's path and only a mistake reads it.
    """

    __slots__ = ("place", "outer", "undo", "origin", "ctx", "used")

    def __repr__(self) -> str:
        return f"<placeenv scope on {_name(self.place)}>"


class ScopeError(RuntimeError):
    """A scope's exit does not match the calling context's innermost scope (nothing was changed)."""


#: This context's innermost scope (a :class:`Scope`), or None to follow the main thread.
override: ContextVar = ContextVar("placeenv_override", default=None)
_get, _set, _reset = override.get, override.set, override.reset  # bound once: every scope uses them

#: ``undo``: the scope kept the device it found, so leaving it changes nothing.
KEPT = object()
#: ``undo``: leaving the scope re-aims the thread's Tracer at the outer device.
RETARGET = object()
#: ``outer`` of a token that changed no scope: a guard that moved the global device.
UNSCOPED = object()
#: ``origin`` of a resumed step's token: the body may leave scopes open across a yield.
RESUMED = object()
_MAIN = threading.main_thread().ident

#: True while installed. Uninstalled, a scope does what Paddle's own guard does
#: (swap the global device, put it back after): stock semantics, leaks included.
enabled = False
#: ``_internals.global_place``, bound by :func:`enable`. The contract module
#: resolves its names on first read through a module ``__getattr__``, and
#: Python does not specialise attribute reads on such a module, so the scope's
#: way in, which reads the global device, calls it through this global.
_global_place = None


def enable() -> None:
    """install(): placeenv's scopes from now on."""
    global enabled, _global_place
    _global_place = _pd.global_place
    enabled = True


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
    scope = _get()
    if scope is None:
        place = _global_place()
        return init_global() if place is None else place
    return scope.place


def own_place():
    """The calling context's own device, or None when it follows the main thread."""
    scope = _get()
    return None if scope is None else scope.place


def innermost() -> Scope | None:
    """The calling context's innermost scope: what a suspended body resumes at its next step.

    Stock Paddle keeps no scopes, only the global device: uninstalled, a scope of just that.
    """
    if not enabled:
        return body_scope(_pd.current_expected_place())
    return _get()


# -- into a scope: each returns the token that detach() ends it with ---------
# A Scope is made with no arguments and its fields set one by one: a class
# with an __init__ costs one Python call more on every way in.


def attach(place, origin=None) -> Scope:
    """Make ``place`` (canonical) the calling context's device until :func:`detach` of the token returned.

    ``origin`` is the opener whose exit ends the scope (the ``PlaceEnv`` of
    :func:`enter`), or None when the token does.
    """
    if not enabled:  # stock Paddle: every scope swaps the one global device
        scope = Scope()
        scope.place, scope.outer, scope.origin = place, _get(), origin
        scope.undo = _pd.current_expected_place()
        _pd.set_expected_place(place)
        scope.ctx = _set(scope)
        return scope
    carrier = _Carrier()
    carrier.place = place
    enter(carrier)  # the one way a scope is opened; the carrier only brings the place
    scope = _get()
    scope.origin = origin  # not yet seen outside this call: the token's own opener
    return scope


class _Carrier:
    """What :func:`enter` reads of a ``PlaceEnv``, for :func:`attach`."""

    __slots__ = ("place",)


def enter(env):
    """``PlaceEnv.__enter__`` itself: open a scope on ``env.place``, with ``env`` as the opener.

    Returns the place. :func:`attach` opens its scopes through it; this way
    round, every ``with PlaceEnv``'s way in is one call.
    """
    place = env.place
    if not enabled:
        attach(place, env)
        return place
    outer = _get()
    if outer is None:
        kept = get_ident() == _MAIN and place is _global_place()
    else:
        kept = place is outer.place
    scope = Scope()
    scope.place = place
    scope.outer = outer
    scope.origin = env
    if kept:
        scope.undo = KEPT
        scope.ctx = _set(scope)
        return place
    scope.undo = RETARGET
    scope.ctx = _set(scope)
    sync_tracer(place)
    return place


def attach_guard(place, origin=None) -> Scope:
    """A scope for Paddle's own guards (``origin``: the guard's instance, if any).

    On the bare main thread they move the global device instead, as stock
    Paddle's do (``paddle.disable_static`` holds one open for the whole program,
    and threads that follow the main thread follow it): that token changes no
    scope. Elsewhere they always re-aim the Tracer, since Paddle may have just
    switched the thread to a fresh Tracer of its own (``dygraph.guard``).
    """
    outer = _get()
    token = Scope()
    token.place = place
    token.origin = origin
    token.used = False  # detach() reads it: this token may change no scope
    if not enabled:
        token.outer, token.undo = UNSCOPED, _pd.current_expected_place()
        _pd.set_expected_place(place)
        return token
    if outer is None and get_ident() == _MAIN:
        token.outer, token.undo = UNSCOPED, _global_place()
        set_global(place)
        return token
    token.outer, token.undo = outer, RETARGET
    token.ctx = _set(token)
    sync_tracer(place)
    return token


def body_scope(place) -> Scope:
    """The scope a decorated body starts in: ``place``, with no outer scope of its own.

    No token ends it, and no exit inside the body can (its ``origin`` is None):
    only the steps, which :func:`resume` it and :func:`detach` their own tokens.
    """
    scope = Scope()
    scope.place = place
    scope.outer = scope.origin = None
    scope.undo = RETARGET
    return scope


def resume(scope: Scope) -> Scope:
    """Install a suspended body's scope (:func:`innermost` at the end of its last step) as it was,
    inner scopes and all, until :func:`detach` of the token returned.

    The body may leave scopes open across a yield (a ``with`` around it), so
    this token's detach does not ask for its scope to be the innermost one.
    """
    place = scope.place
    token = Scope()
    token.place = place
    token.outer = _get()
    token.origin = RESUMED
    token.used = False  # detach() reads it: its scope is not the innermost
    if not enabled:  # stock Paddle: the step swaps the global device; its scopes nest in the token
        token.undo = _pd.current_expected_place()
        _pd.set_expected_place(place)
        token.ctx = _set(token)
    else:  # the body's own scope, inner scopes and all, on a Tracer re-aimed at its device
        token.undo = RETARGET
        token.ctx = _set(scope)
        sync_tracer(place)
    return token


# -- out of a scope ------------------------------------------------------------
# Leaving resets the ContextVar with the token its set returned, as
# ContextVar.reset means: cheaper than a second set, and it refuses a context
# that is a copy of the one that entered (a task or bind() started inside the
# scope sees the same innermost scope, but must not end it).


def detach(token: Scope) -> None:
    """End the scope ``token`` opened: the context returns to the scope it had before.

    The scope must be the context's innermost one, or the replacement a
    ``paddle.set_device`` inside it made; anything else (an exit out of order,
    a token used twice, a token of another thread or task) raises
    :class:`ScopeError` and changes nothing. A token kept across ``install()``
    or ``uninstall()`` still ends its scope cleanly: it says how to undo itself.
    """
    scope = _get()
    if scope is not token and (scope is None or scope.origin is not token):
        _detach_other(token, scope)
        return
    if scope.undo is KEPT:
        try:
            _reset(token.ctx)
        except (ValueError, RuntimeError) as error:
            raise ScopeError(_copied(_token(token), scope)) from error
    else:
        _end(scope, token)
    token.used = True


def leave(env, exc_type=None, exc=None, tb=None) -> bool:
    """``PlaceEnv.__exit__`` itself: end the calling context's innermost scope, which ``env`` entered.

    The instance is shared between threads and tasks, so its token is the
    scope it left in the context, and the check is that the innermost scope
    (or the replacement a ``set_device`` made of it) is one that this instance
    entered. Anything else raises :class:`ScopeError` and changes nothing.
    """
    scope = _get()
    if scope is None or scope.origin is not env:
        _leave_replaced(env, scope)
        return False
    if scope.undo is KEPT:
        try:
            _reset(scope.ctx)
        except (ValueError, RuntimeError) as error:
            raise ScopeError(_copied(f"{env!r}.__exit__", scope)) from error
        return False
    _end(scope, scope)
    return False


def _end(scope: Scope, token: Scope) -> None:
    """Undo what ``token`` did: its scope is ``scope`` (the innermost, or what a set_device made of
    it); a token that changed no scope has none."""
    outer, undo = scope.outer, scope.undo
    if outer is UNSCOPED:  # a guard that moved the global device, and no scope
        _restore_global(undo)
        return
    try:
        _reset(token.ctx)
    except (ValueError, RuntimeError) as error:
        raise ScopeError(_copied(_token(token), scope)) from error
    if undo is KEPT:
        return
    if undo is not RETARGET:  # the scope moved the global device: put it back
        _restore_global(undo)
    sync_tracer(None if outer is None else outer.place)


def _detach_other(token: Scope, scope: Scope | None) -> None:
    """detach() of a token whose scope is not the innermost: one that changed no scope (a guard on
    the bare main thread), a resumed step's, or a mistake (raised, and nothing changes)."""
    if token.outer is UNSCOPED or token.origin is RESUMED:
        if token.used:
            raise ScopeError(f"{_token(token)}: this token has already been used once (nothing was changed)")
        _end(token, token)
        token.used = True
        return
    if getattr(token, "used", False):  # unset until a detach() ends it
        gone = "this token has already been used once: its scope was exited already"
    else:
        gone = "its scope is not open in this thread or task: the token was attached in another one"
    raise ScopeError(_mismatch(_token(token), scope, lambda s: s is token, gone))


def _leave_replaced(env, scope: Scope | None) -> None:
    """leave() when the innermost scope is not one ``env`` entered as such: what a set_device made
    of one (ended), or a mistake (raised, and nothing changes)."""
    if scope is not None:
        original = scope.origin
        if type(original) is Scope and original.origin is env:
            _end(scope, original)
            return
    gone = ("no scope it entered is open in this thread or task: it was exited already, "
            "or entered in another thread or task")
    raise ScopeError(_mismatch(f"{env!r}.__exit__", scope, lambda s: s.origin is env, gone))


def _token(token: Scope) -> str:
    return f"detach() of the scope on {_name(token.place)}"


def _copied(what: str, scope: Scope) -> str:
    return (
        f"{what}: the scope {_describe(scope)} was entered in another context, of which this one is a "
        f"copy (a task, bind(), asyncio.to_thread or Context.run started inside the scope): a copy sees "
        f"the scope but may not end it (nothing was changed)"
    )


def _mismatch(what: str, scope: Scope | None, opened, gone: str) -> str:
    """Why ``what`` cannot end its scope: the calling context's innermost scope is ``scope``, another one.

    ``opened(s)`` tells the scope ``what`` opened; ``gone`` says why it is not open here at all.
    """
    depth, inner = 0, scope
    while inner is not None and inner is not UNSCOPED:
        if opened(inner.origin if type(inner.origin) is Scope else inner):
            return (
                f"{what}: exit out of order: {depth} scope(s) entered inside its scope are still open "
                f"in this thread or task, the innermost {_describe(scope)}. "
                f"Exit those first (nothing was changed)."
            )
        depth, inner = depth + 1, inner.outer
    where = ("no scope is open in this thread or task" if scope is None
             else f"its innermost scope is the one {_describe(scope)}")
    return f"{what}: {gone}; {where} (nothing was changed)."


def _describe(scope: Scope) -> str:
    original = scope.origin if type(scope.origin) is Scope else scope
    opener = original.origin
    by = "" if opener is None or opener is RESUMED else f" entered by {opener!r}"
    return f"on {_name(scope.place)}{by}"


def _name(place) -> str:
    try:
        return device_name(place)
    except Exception:  # noqa: BLE001 - a message must not fail on an odd place
        return repr(place)


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
    scope = _get()
    if scope is None:
        if get_ident() == _MAIN:
            set_global(place)
        else:
            attach(place)  # never detached: the thread's own device from now on
        return
    replacement = Scope()
    replacement.place, replacement.outer = place, scope.outer
    replacement.undo = RETARGET if scope.undo is KEPT else scope.undo
    # The scope it stands for: the original, also when this replaces a replacement.
    replacement.origin = scope.origin if type(scope.origin) is Scope else scope
    _set(replacement)
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
    if place is not None and place is _global_place() and get_ident() == _MAIN:
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
