"""The supervisor (``--frontends`` K >= 1): starts the engine and K front ends, restarts what dies, stops them.

It imports neither Paddle nor the app. It takes the HTTP socket cli.py bound, makes
the run directory (``runtime``), starts the engine (``python -m placeenv.serve.process.engine_main``)
and, once the engine is ready, the front ends (``python -m placeenv.serve.process.frontend_main``),
each inheriting the socket.

* A front end that dies is started again; the others keep serving, and only its
  own requests in flight are lost (each client sees its connection close).
* An engine that dies is started again (``--restart always``): meanwhile the
  front ends answer its requests in flight and new ones with 503 and Retry-After,
  and readiness is off. With ``--restart never`` the service exits non-zero.
* An engine or front end whose event loop has not run for ``--hung-after-s`` (its
  beat in the run directory is that old) is killed, and handled as one that died.
* SIGTERM or SIGINT: the front ends stop (readiness off, the shutdown delay, the
  listener closes, accepted requests are answered), then the engine stops; exit 0.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import runtime
from ..config import Settings

log = logging.getLogger(__name__)

#: How often the supervisor looks at its children and at the signal flag.
TICK_S = 0.05


class Supervisor:
    def __init__(self, settings: Settings, sock: socket.socket, argv: list[str], ready_message) -> None:
        self.settings, self.sock, self.argv = settings, sock, argv
        self.ready_message = ready_message
        self.count = settings.frontend_count()
        self.run = Path(tempfile.mkdtemp(prefix="placeenv-"))
        (self.run / "metrics").mkdir()
        self.flags = runtime.ReadyFlags(self.run / "ready", self.count + 1)
        self.beats = runtime.Heartbeats(self.run / "beats", self.count + 1)
        self.env = {**os.environ, runtime.RUN_DIR: str(self.run), runtime.SUPERVISOR: str(os.getpid()),
                    "PROMETHEUS_MULTIPROC_DIR": str(self.run / "metrics")}
        self.engine: subprocess.Popen | None = None
        self.frontends: list[subprocess.Popen | None] = [None] * self.count
        self.signalled = 0
        self.stopping = False

    # -- children ----------------------------------------------------------------------------

    def _start_engine(self) -> None:
        self.beats.beat(0, 0.0)  # silent until the new engine's loop runs
        self.engine = subprocess.Popen([sys.executable, "-m", "placeenv.serve.process.engine_main", *self.argv], env=self.env)

    def _start_frontend(self, index: int) -> None:
        fd = self.sock.fileno()
        env = {**self.env, runtime.FRONTEND_INDEX: str(index), runtime.LISTEN_FD: str(fd)}
        self.beats.beat(index + 1, 0.0)
        self.frontends[index] = subprocess.Popen([sys.executable, "-m", "placeenv.serve.process.frontend_main", *self.argv],
                                                 env=env, pass_fds=(fd,))

    def _gone(self, proc: subprocess.Popen, flag: int) -> None:
        """A child has exited: its readiness and its live gauges go with it."""
        self.flags.set(flag, False)
        from .. import metrics  # single-process mode here: the supervisor serves no metrics of its own

        metrics.process_dead(proc.pid, str(self.run / "metrics"))

    # -- the life of the service -------------------------------------------------------------

    def serve(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            code = self._start()
            if code is None:
                code = self._watch()
            return code
        finally:
            self._stop_all()
            shutil.rmtree(self.run, ignore_errors=True)

    def _on_signal(self, sig, frame) -> None:
        self.signalled += 1
        if self.signalled > 1 and self.stopping:
            # A second signal hurries the stop, as it does the single process's: each front end
            # skips what is left of its shutdown delay.
            for proc in self.frontends:
                if proc is not None and proc.poll() is None:
                    proc.send_signal(runtime.STOP)

    def _start(self) -> int | None:
        """Start the engine and, once it is ready, the front ends; None once all are ready, else the
        exit status (a signal during start-up: 0, after stopping what already serves)."""
        self._start_engine()
        while not self.flags.all():
            if self.signalled:
                return self._stop_children() if self._any_frontend() else 0
            if self.engine.poll() is not None:
                self._gone(self.engine, 0)
                log.error("the engine exited during start-up (exit status %s)", self.engine.returncode)
                return 1
            for index, proc in enumerate(self.frontends):
                if proc is not None and proc.poll() is not None:
                    log.error("front end %d did not start (exit status %s)", index, proc.returncode)
                    return 1
            if self.flags.is_set(0) and not self._any_frontend():  # the engine is ready: its front ends now
                for index in range(self.count):
                    self._start_frontend(index)
            time.sleep(TICK_S)
        print(self.ready_message(), f"({self.count} front ends, pid {os.getpid()})", flush=True)
        return None

    def _any_frontend(self) -> bool:
        return any(proc is not None for proc in self.frontends)

    def _watch(self) -> int:
        backoff = {"engine": Backoff(), **{f"frontend {i}": Backoff() for i in range(self.count)}}
        awake_since = last = time.monotonic()
        while not self.signalled:
            now = time.monotonic()
            if now - last > 2 * runtime.BEAT_S:
                # This loop was away (the whole service paused: docker pause, SIGSTOP of the group, a
                # stalled VM): so were the children. Their silence counts from now, not from before.
                awake_since = now
            last = now
            if self.settings.hung_after_s:
                self._kill_hung(now, awake_since)
            for index, proc in enumerate(self.frontends):
                key = f"frontend {index}"
                if proc is not None and proc.poll() is not None:
                    self._gone(proc, index + 1)
                    self.frontends[index] = None
                    log.error("front end %d (pid %d) exited with status %s: starting it again in %.1f s",
                              index, proc.pid, proc.returncode, backoff[key].next(now))
                if self.frontends[index] is None and backoff[key].due(now):
                    self._start_frontend(index)
            if self.engine is not None and self.engine.poll() is not None:
                self._gone(self.engine, 0)
                if self.settings.restart == "never" or self.engine.returncode == runtime.CANNOT_START:
                    log.error("the engine (pid %d) exited with status %s; --restart %s: stopping the service",
                              self.engine.pid, self.engine.returncode, self.settings.restart)
                    return max(1, self._stop_children())
                log.error("the engine (pid %d) exited with status %s: starting it again in %.1f s",
                          self.engine.pid, self.engine.returncode, backoff["engine"].next(now))
                self.engine = None
            if self.engine is None and backoff["engine"].due(now):
                self._start_engine()
            for key, proc in (("engine", self.engine), *((f"frontend {i}", p) for i, p in enumerate(self.frontends))):
                if proc is not None and self._ready_for(key):
                    backoff[key].reset()
            time.sleep(TICK_S)
        return self._stop_children()

    def _kill_hung(self, now: float, awake_since: float) -> None:
        """SIGKILL each child whose event loop has not run for ``hung_after_s`` (since ``awake_since``,
        when this loop last came back from a pause): the watch then sees it die, and its requests in
        flight are answered as a dead process's are."""
        for index, proc in enumerate([self.engine, *self.frontends]):
            silent = self.beats.silent_for(index, now)
            if proc is None or silent is None or proc.poll() is not None:
                continue
            silent = min(silent, now - awake_since)
            if silent <= self.settings.hung_after_s:
                continue
            log.error("%s (pid %d): its event loop has not run for %.1f s (--hung-after-s %g): killing it",
                      "the engine" if index == 0 else f"front end {index - 1}", proc.pid, silent,
                      self.settings.hung_after_s)
            self.beats.beat(index, 0.0)
            proc.kill()

    def _ready_for(self, key: str) -> bool:
        return self.flags.is_set(0 if key == "engine" else int(key.split()[1]) + 1)

    def _stop_children(self) -> int:
        """Front ends first (each stops as the single process does), then the engine."""
        self.stopping = True
        log.info("stopping: the front ends first, then the engine")
        # The front ends hold their own copies: once they close theirs, new connections are refused.
        self.sock.close()
        codes = []
        for proc in self.frontends:
            if proc is not None and proc.poll() is None:
                proc.send_signal(runtime.STOP)
        limit = self.settings.shutdown_delay_s + self.settings.shutdown_grace_s + 10
        for proc in self.frontends:
            if proc is not None:
                codes.append(_wait(proc, limit))
        if self.engine is not None:
            if self.engine.poll() is None:
                self.engine.send_signal(runtime.STOP)
            codes.append(_wait(self.engine, self.settings.shutdown_grace_s + 10))
        bad = [c for c in codes if c != 0]
        if bad:
            log.error("stopped; exit statuses %s", codes)
        return 1 if bad else 0

    def _stop_all(self) -> None:
        for proc in [*self.frontends, self.engine]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


class Backoff:
    """When to start a process again: at once the first time, then twice as long after each exit that
    comes before it was ready, up to half a minute; a process that became ready starts the count again."""

    def __init__(self) -> None:
        self.delay, self.at = 0.0, 0.0

    def next(self, now: float) -> float:
        waited = self.delay
        self.at = now + waited
        self.delay = min(30.0, max(0.5, self.delay * 2))
        return waited

    def due(self, now: float) -> bool:
        return now >= self.at

    def reset(self) -> None:
        self.delay = 0.0


def _wait(proc: subprocess.Popen, limit: float) -> int:
    try:
        return proc.wait(limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
