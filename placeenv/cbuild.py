"""C++ pieces compiled on first use with the system compiler and cached by content hash: the sim
device plugin (:mod:`placeenv.sim`) and the Predictor-run shim (:mod:`placeenv.native`)."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["BuildError", "cache_root", "compiler", "shared_library", "user_cache"]


#: A compiler that hangs holds up every worker's start: it fails instead.
COMPILE_TIMEOUT_S = 600


class BuildError(RuntimeError):
    """A C++ piece could not be compiled."""


def user_cache() -> Path:
    """placeenv's per-user cache: ``$XDG_CACHE_HOME/placeenv``, or ``~/.cache/placeenv``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "placeenv"


def cache_root(variable: str, name: str) -> Path:
    """Where a built piece is kept: the directory ``$variable`` names, else ``name`` in :func:`user_cache`."""
    return Path(os.environ[variable]) if os.environ.get(variable) else user_cache() / name


def compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    raise BuildError("no C++ compiler found (set CXX, or install g++)")


def shared_library(source: Path, name: str, root: Path, flags: tuple[str, ...] = (), salt: bytes = b"",
                   force: bool = False, what: str = "") -> Path:
    """``source`` compiled into ``root/<digest>/<name>`` unless it is there already; the digest covers the
    source and ``salt`` (the headers it reads), not ``flags``, whose include paths name this machine's
    directories. Returns the library's path."""
    digest = hashlib.sha256(source.read_bytes() + salt).hexdigest()[:16]
    directory = root / digest
    library = directory / name
    if library.is_file() and not force:
        return library
    directory.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent builders never see half a file,
    # and the directory never holds anything but the finished library.
    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        partial = Path(tmp) / name
        command = [compiler(), "-std=c++17", "-O2", "-fPIC", "-shared", *flags, str(source), "-o", str(partial)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BuildError(f"compiling {what or name} took over {COMPILE_TIMEOUT_S} s: $ {shlex.join(command)}") from None
        if result.returncode != 0:
            raise BuildError(f"compiling {what or name} failed:\n$ {shlex.join(command)}\n{result.stderr[-4000:]}")
        os.replace(partial, library)
    return library
