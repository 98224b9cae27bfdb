"""Every Paddle internal that placeenv touches, in one place.

The patch swaps the *code* of Paddle's own function objects, because about 40
Paddle modules import them by name (``from ..framework import
_current_expected_place``); rebinding a module attribute would miss them.
A swapped function keeps its globals (``paddle.base.framework``), so the
replacement bodies below read Paddle's own names (``_global_expected_place_``,
``core``) plus a few helpers that the patch injects under ``_placeenv_*``
names. ``uninstall()`` puts the original code objects back and deletes the
injected names, so stock Paddle is restored exactly.
"""

from __future__ import annotations

import os
import warnings

import paddle
from paddle.base import core, framework

# Versions whose internals were read and tested. Anything else fails loudly
# unless PLACEENV_ALLOW_UNTESTED_PADDLE=1.
TESTED_PADDLE = ("3.3",)
ALLOW_UNTESTED_ENV = "PLACEENV_ALLOW_UNTESTED_PADDLE"


class UnsupportedPaddleError(RuntimeError):
    """The imported Paddle is a version whose internals placeenv has not checked."""


def check_version(version: str | None = None) -> None:
    version = paddle.__version__ if version is None else version
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


# -- the internals -----------------------------------------------------------

#: Module holding the Python copy of the current device.
FRAMEWORK = framework
#: Tracer class: one is created per thread that diverges from the main device.
Tracer = paddle.base.dygraph.tracer.Tracer
#: Switches the C++ thread-local tracer (egr::Controller) of the calling thread.
switch_tracer = core._switch_tracer
#: threading.local with the Python-side tracer of each thread.
global_var = framework.global_var

#: Functions whose ``__code__`` is replaced, by dotted name inside framework.
#: ``_dygraph_place_guard`` is a contextmanager; its generator is ``__wrapped__``.
#: ``GlobalThreadLocal.__setattr__`` rebinds ``framework._dygraph_tracer_`` (the
#: Tracer each new thread starts with) whenever *any* thread switches Tracer,
#: which would hand a thread's private Tracer to every thread started later.
CODE_TARGETS = (
    "_current_expected_place_",
    "_set_expected_place",
    "_dygraph_place_guard",
    "GlobalThreadLocal.__setattr__",
)

#: Context-manager classes whose ``__enter__``/``__exit__`` keep state on the
#: instance (``paddle.device.device``, ``device_guard``) or on the class
#: (``paddle.device.Device._DEFAULT_DEVICE_STACK``): replaced by methods that
#: keep a per-context stack. ``paddle.cuda.device`` is the same class object.
GUARD_CLASSES = (
    paddle.device.device,
    paddle.device.device_guard,
    paddle.device.Device,
)

#: Aliases added on install: the design's public name.
ALIASES = ((paddle, "PlaceEnv"), (paddle.device, "PlaceEnv"))


def code_owner(name: str):
    """The function object whose ``__code__`` we swap for ``framework.<name>``."""
    fn = framework
    for part in name.split("."):
        fn = getattr(fn, part)
    return getattr(fn, "__wrapped__", fn)


# -- replacement bodies (run with paddle.base.framework as their globals) ----
# The _placeenv_* names are injected into framework's globals by the patch.


def _current_expected_place_():
    node = _placeenv_own()  # noqa: F821 - the ContextVar's bound get
    if node is None:
        place = _global_expected_place_  # noqa: F821
        if place is None or type(place) is core.Place:
            return _placeenv_init_global()  # noqa: F821
        return place
    return node[0]


def _set_expected_place(place):
    _placeenv_set_place(place)  # noqa: F821


def _dygraph_place_guard(place):
    token = _placeenv_push(place)  # noqa: F821
    try:
        yield
    finally:
        _placeenv_pop(token)  # noqa: F821


def __setattr__(self, name, val):
    if name == "_dygraph_tracer_":
        _placeenv_tracer_switched(val)  # noqa: F821
        core._switch_tracer(val)
    self.__dict__[name] = val


REPLACEMENTS = {
    "_current_expected_place_": _current_expected_place_,
    "_set_expected_place": _set_expected_place,
    "_dygraph_place_guard": _dygraph_place_guard,
    "GlobalThreadLocal.__setattr__": __setattr__,
}
