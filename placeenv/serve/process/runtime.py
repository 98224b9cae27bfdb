"""What the supervisor shares with the engine and the front ends it starts: one run directory.

    <run dir>/engine.sock   the engine's ipc endpoint (link.py)
    <run dir>/metrics/      prometheus_client's multiprocess files (PROMETHEUS_MULTIPROC_DIR)
    <run dir>/ready         one byte per process, engine first: 1 while that process is ready
    <run dir>/beats         one time per process, engine first: when its event loop last ran

The supervisor makes the directory and the flags, and clears a process's flag when
it exits; each process sets its own. A front end is ready only when every flag is set.
A process whose event loop has not run for ``--hung-after-s`` is killed by the
supervisor and started again, as if it had died.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import signal
import struct
import time
from pathlib import Path

#: The run directory, set by the supervisor in each child's environment.
RUN_DIR = "PLACEENV_RUN_DIR"
#: The supervisor's process id, for a child to know whether it still runs.
SUPERVISOR = "PLACEENV_SUPERVISOR_PID"
#: A front end's index (0..K-1), and the file descriptor of the HTTP socket it inherits.
FRONTEND_INDEX = "PLACEENV_FRONTEND_INDEX"
LISTEN_FD = "PLACEENV_LISTEN_FD"


class ReadyFlags:
    """One byte per process in a shared file: the engine's at 0, front end i's at i + 1."""

    def __init__(self, path: Path, count: int | None = None) -> None:
        if count is not None:
            path.write_bytes(bytes(count))
        self._file = open(path, "r+b")  # noqa: SIM115 - mapped for the process's life
        self._map = mmap.mmap(self._file.fileno(), 0)

    def set(self, index: int, ready: bool) -> None:
        self._map[index] = 1 if ready else 0

    def is_set(self, index: int) -> bool:
        return bool(self._map[index])

    def all(self) -> bool:
        return all(self._map[:])


#: How often a process's event loop writes its beat.
BEAT_S = 0.5


class Heartbeats:
    """One ``time.monotonic()`` per process in a shared file (CLOCK_MONOTONIC: one clock for every
    process of the machine), at the indices of ``ReadyFlags``; 0.0: none since it started."""

    def __init__(self, path: Path, count: int | None = None) -> None:
        if count is not None:
            path.write_bytes(bytes(8 * count))
        self._file = open(path, "r+b")  # noqa: SIM115 - mapped for the process's life
        self._map = mmap.mmap(self._file.fileno(), 0)

    def beat(self, index: int, at: float | None = None) -> None:
        struct.pack_into("d", self._map, 8 * index, time.monotonic() if at is None else at)

    def silent_for(self, index: int, now: float) -> float | None:
        """Seconds since process ``index``'s last beat; None before its first."""
        (last,) = struct.unpack_from("d", self._map, 8 * index)
        return now - last if last else None


async def beating(beats: Heartbeats, index: int) -> None:
    """Beat for process ``index`` while this event loop runs (cancel to stop)."""
    while True:
        beats.beat(index)
        await asyncio.sleep(BEAT_S)


def die_with_parent() -> None:
    """Ask Linux to kill this process when the supervisor that started it dies, even by kill -9
    (``PR_SET_PDEATHSIG``): no engine or front end outlives the service, nor holds its port while a
    replacement starts. The service crashed; its requests in flight are lost as a single process's
    would be. Elsewhere than Linux, nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if not supervised():  # it died before the request took effect
        os._exit(1)


#: Exit status of an engine that cannot start as configured: the supervisor does not restart it.
CANNOT_START = 3

#: The signal the supervisor stops its children with. SIGTERM and SIGINT may reach every process
#: of the group at once (Ctrl-C, ``timeout``, systemd): a child leaves those to the supervisor,
#: which stops the front ends first, then the engine.
STOP = signal.SIGUSR1


def supervised() -> bool:
    """Whether the supervisor that started this process still runs (it is still our parent)."""
    return os.getppid() == _PARENT


_PARENT = int(os.environ.get(SUPERVISOR) or os.getppid())


def run_dir() -> Path | None:
    found = os.environ.get(RUN_DIR)
    return Path(found) if found else None
