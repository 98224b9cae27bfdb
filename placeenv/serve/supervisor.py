"""The supervisor (``--frontends`` K >= 1): starts the engine and K front ends, restarts what dies, drains.

It imports neither Paddle nor the app. It binds the HTTP socket (``__main__``), makes
the run directory (``runtime``), starts the engine (``python -m placeenv.serve.engine``)
and, once the engine is ready, the front ends (``python -m placeenv.serve.frontend``),
each inheriting the socket.

* A front end that dies is started again; the others keep serving, and only its
  own requests in flight are lost (each client sees its connection close).
* An engine that dies is started again (``--restart always``): meanwhile the
  front ends answer its requests in flight and new ones with 503 and Retry-After,
  and readiness is off. With ``--restart never`` the service exits non-zero.
* SIGTERM or SIGINT: the front ends drain (readiness off, the shutdown delay, the
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
from .config import Settings

log = logging.getLogger("placeenv.serve.supervisor")

#: How often the supervisor looks at its children and at the signal flag.
TICK_S = 0.05
#: The engine's exit status when it cannot start as configured (engine.CANNOT_START).
CANNOT_START = 3


class Supervisor:
    def __init__(self, settings: Settings, sock: socket.socket, argv: list[str], ready_message) -> None:
        self.settings, self.sock, self.argv = settings, sock, argv
        self.ready_message = ready_message
        self.count = settings.frontend_count()
        self.run = Path(tempfile.mkdtemp(prefix="placeenv-"))
        (self.run / "metrics").mkdir()
        self.flags = runtime.ReadyFlags(self.run / "ready", self.count + 1)
        self.env = {**os.environ, runtime.RUN_DIR: str(self.run),
                    "PROMETHEUS_MULTIPROC_DIR": str(self.run / "metrics")}
        self.engine: subprocess.Popen | None = None
        self.frontends: list[subprocess.Popen | None] = [None] * self.count
        self.signalled = 0
        self.restarts = {"engine": 0, "frontend": 0}

    # -- children ----------------------------------------------------------------------------

    def _start_engine(self) -> None:
        self.engine = subprocess.Popen([sys.executable, "-m", "placeenv.serve.engine", *self.argv], env=self.env)

    def _start_frontend(self, index: int) -> None:
        fd = self.sock.fileno()
        env = {**self.env, runtime.FRONTEND_INDEX: str(index), runtime.LISTEN_FD: str(fd)}
        self.frontends[index] = subprocess.Popen([sys.executable, "-m", "placeenv.serve.frontend", *self.argv],
                                                 env=env, pass_fds=(fd,))

    def _gone(self, proc: subprocess.Popen, flag: int) -> None:
        """A child has exited: its readiness and its live gauges go with it."""
        self.flags.set(flag, False)
        from prometheus_client import multiprocess  # the supervisor serves no metrics of its own

        multiprocess.mark_process_dead(proc.pid, str(self.run / "metrics"))

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

    def _start(self) -> int | None:
        """Start the engine, then the front ends; None once all are ready, else the exit status."""
        self._start_engine()
        while not self.flags.count() or not self.flags.all() and not self._any_frontend():
            if self.signalled:
                return 0
            code = self.engine.poll()
            if code is not None:
                self._gone(self.engine, 0)
                log.error("the engine did not start (exit status %s)", code)
                return 1
            if self.flags.count() and not self._any_frontend():  # the engine is ready: its front ends now
                for index in range(self.count):
                    self._start_frontend(index)
            time.sleep(TICK_S)
        while not self.flags.all():
            if self.signalled:
                return 0
            for index, proc in enumerate(self.frontends):
                if proc.poll() is not None:
                    log.error("front end %d did not start (exit status %s)", index, proc.returncode)
                    return 1
            if self.engine.poll() is not None:
                log.error("the engine exited while the front ends started (exit status %s)", self.engine.returncode)
                return 1
            time.sleep(TICK_S)
        print(self.ready_message(), f"({self.count} front ends, pid {os.getpid()})", flush=True)
        return None

    def _any_frontend(self) -> bool:
        return any(proc is not None for proc in self.frontends)

    def _watch(self) -> int:
        while not self.signalled:
            for index, proc in enumerate(self.frontends):
                if proc.poll() is not None:
                    self._gone(proc, index + 1)
                    log.error("front end %d (pid %d) exited with status %s: starting it again",
                              index, proc.pid, proc.returncode)
                    self.restarts["frontend"] += 1
                    self._start_frontend(index)
            if self.engine.poll() is not None:
                self._gone(self.engine, 0)
                if self.settings.restart == "never" or self.engine.returncode == CANNOT_START:
                    log.error("the engine (pid %d) exited with status %s; --restart %s: stopping the service",
                              self.engine.pid, self.engine.returncode, self.settings.restart)
                    return 1
                log.error("the engine (pid %d) exited with status %s: starting it again",
                          self.engine.pid, self.engine.returncode)
                self.restarts["engine"] += 1
                self._start_engine()
            time.sleep(TICK_S)
        return self._drain()

    def _drain(self) -> int:
        """Front ends first (each drains as the single process does), then the engine."""
        log.info("stopping: the front ends drain, then the engine stops")
        codes = []
        for proc in self.frontends:
            if proc.poll() is None:
                proc.send_signal(runtime.STOP)
        limit = self.settings.shutdown_delay_s + self.settings.shutdown_grace_s + 10
        for proc in self.frontends:
            codes.append(_wait(proc, limit))
        self.sock.close()
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


def _wait(proc: subprocess.Popen, limit: float) -> int:
    try:
        return proc.wait(limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
