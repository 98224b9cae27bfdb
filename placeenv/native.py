"""A Paddle Inference Predictor's run without the GIL, on the CPU.

Paddle 3.3's binding holds the GIL for the whole of a Predictor's ``run()`` (it lets go only where an
npu plugin is loaded), so in one process two Predictors' runs take turns, and every other Python thread
waits for each. Paddle's C++ API runs Predictors side by side, one a thread: its documented way to
deploy on several cores. Here the same ``paddle_infer::Predictor::Run()`` is called through ctypes,
which lets go of the GIL for the call, from a small shim (``predictor_run.cc`` beside this module, compiled on first use
as the sim plugin is, and cached by content hash) that turns a C++ exception into Paddle's message:
an exception that reached ctypes' C frames would abort the process.

Only the run leaves the GIL: inputs are bound and outputs copied through the binding's own handles,
before and after it. A Predictor is never run by two threads at once (the caller's lock says so).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

from . import _internals as _pd
from . import cbuild

__all__ = ["ERRORS", "PredictorRunError", "build", "error", "cache_root", "runner", "unavailable"]

SOURCE = Path(__file__).with_name("predictor_run.cc")
LIBRARY_NAME = "libplaceenv-predictor-run.so"
#: ``0`` keeps the binding's own run, which holds the GIL.
SWITCH = "PLACEENV_PREDICTOR_RUNS_WITHOUT_GIL"
#: Room for Paddle's error text, which carries its C++ call stack.
MESSAGE_SIZE = 1 << 16


class PredictorRunError(RuntimeError):
    """A Predictor's run failed in Paddle, with an error of no category below: the message is Paddle's."""


#: The Python exception the binding raises for each of Paddle's error categories (its message says
#: "(Category)", or "CategoryError:" where Paddle prints its C++ call stack first), so a run without the GIL
#: fails as the binding's run would.
ERRORS = {"InvalidArgument": ValueError, "NotFound": RuntimeError, "OutOfRange": IndexError,
          "AlreadyExists": RuntimeError, "ResourceExhausted": MemoryError, "PreconditionNotMet": RuntimeError,
          "PermissionDenied": RuntimeError, "ExecutionTimeout": RuntimeError, "Unimplemented": NotImplementedError,
          "Unavailable": RuntimeError, "Fatal": SystemError, "External": OSError}
_CATEGORY = re.compile(r"\((" + "|".join(ERRORS) + r")\) |\b(" + "|".join(ERRORS) + r")Error: ")


def error(message: str) -> Exception:
    """The exception for Paddle's error ``message``: its category's, as the binding's."""
    found = _CATEGORY.search(message)
    return (ERRORS[found.group(1) or found.group(2)] if found else PredictorRunError)(message)


def cache_root() -> Path:
    """Where the shim is kept: ``$PLACEENV_NATIVE_CACHE``, else ``native`` in placeenv's user cache."""
    return cbuild.cache_root("PLACEENV_NATIVE_CACHE", "native")


def build(force: bool = False) -> Path:
    """Compile the shim if needed; returns its path."""
    return cbuild.shared_library(SOURCE, LIBRARY_NAME, cache_root(), force=force,
                                 what="placeenv's Predictor-run shim")


_building = threading.Lock()


def _entry() -> tuple[Callable, int] | str:
    """The shim's function and the address of ``Predictor::Run()``, or why there are none (built once:
    the first replicas of several workers ask at once)."""
    with _building:
        return _found()


@functools.cache
def _found() -> tuple[Callable, int] | str:
    if os.environ.get(SWITCH, "1") == "0":
        return f"turned off ({SWITCH}=0)"
    entry = _pd.predictor_run_entry()
    if entry is None:
        return "this Paddle's library exports no paddle_infer::Predictor::Run()"
    try:
        library = ctypes.CDLL(str(build()))
    except (cbuild.BuildError, OSError) as error:
        return f"the shim that runs it could not be built or loaded ({(str(error).splitlines() or [''])[0][:200]})"
    function = library.placeenv_predictor_run
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function, entry


def unavailable() -> str | None:
    """Why runs cannot leave the GIL in this process, or None where they can."""
    found = _entry()
    return found if isinstance(found, str) else None


class _Run:
    """``predictor``'s run through the shim; holding the Predictor keeps its C++ object alive."""

    def __init__(self, predictor, function: Callable, entry: int, address: int) -> None:
        self.predictor, self._function, self._entry, self._address = predictor, function, entry, address
        self._message = ctypes.create_string_buffer(MESSAGE_SIZE)  # one a Predictor: its runs never overlap

    def __call__(self) -> None:
        code = self._function(self._entry, self._address, self._message, MESSAGE_SIZE)
        if code == 1:
            raise PredictorRunError("Paddle Inference's Predictor.run() returned false")
        if code == 2:
            raise error(self._message.value.decode("utf-8", "replace").strip())


def runner(predictor) -> Callable[[], None] | str:
    """A call that runs ``predictor`` (its inputs bound) with the GIL released, raising the binding's
    exception with Paddle's message where the run fails (:func:`error`), and :class:`PredictorRunError`
    where ``Run()`` returns false (which the binding ignores: its outputs are then not a run's); or, where
    there is none, why."""
    found = _entry()
    if isinstance(found, str):
        return found
    address = _pd.native_predictor(predictor)
    if address is None:
        return "this Predictor is not one whose C++ object placeenv can find (a paddle.inference.Predictor)"
    return _Run(predictor, *found, address)


def main(argv: list[str] | None = None) -> int:
    """``python -m placeenv.native build``: compile the shim now (an image's build does, so a container
    starts without compiling) and print its path."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m placeenv.native",
                                     description="The shim that runs a Paddle Inference Predictor without the GIL.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="compile the shim (cached by content hash) and print its path")
    parser.parse_args(argv)
    try:
        print(build())
    except cbuild.BuildError as exc:
        print(f"placeenv.native: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
