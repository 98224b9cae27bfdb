"""One process's servers: uvicorn with the shutdown a load balancer needs, and the gRPC listener beside it.

The single process (cli.py) and each front end (frontend_main.py) run ``serve``: the same app
(http/app.py) and, with ``--grpc-port``, the same gRPC service (grpc.py), over the gateway that
``connect`` gives: the engine in this process, or the link to the engine process.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from contextlib import asynccontextmanager

import uvicorn

from ..config import Settings
from ..http.app import create_app
from ..protocol.errors import StartupError
from ..protocol.gateway import Gateway
from . import runtime
from .listening import ready_message

log = logging.getLogger(__name__)


class UvicornServer(uvicorn.Server):
    """uvicorn with the shutdown sequence a load balancer needs.

    On SIGTERM/SIGINT:
    1. readiness turns false at once, and requests are still served for
       ``shutdown_delay_s``: the load balancer or the Kubernetes endpoints stop
       routing here meanwhile, so nothing is refused that was already on its way;
    2. the listener closes (and the gRPC one, when served): a proxy's new
       connections are refused, which it can retry elsewhere as nothing was sent;
       idle keep-alive connections close;
    3. accepted requests finish, up to ``shutdown_grace_s``; then the lifespan
       stops the engine (queued work not started by then gets 503 Draining) and
       the process exits 0.
    A second signal during the delay skips the rest of it.
    """

    def __init__(self, config: uvicorn.Config, app, settings: Settings, supervised: bool = False,
                 told: list | None = None, closers: list | None = None) -> None:
        super().__init__(config)
        self.app, self.settings = app, settings
        # A front end: the supervisor says where the service listens, and when to stop (runtime.STOP);
        # ``told`` holds a stop that came before this server took the signal.
        self.supervised, self.told = supervised, told or []
        self.closers = closers if closers is not None else []  # the other listeners' close functions
        self._stop_started = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.supervised:
            signal.signal(runtime.STOP, lambda sig, frame: self.handle_exit(signal.SIGTERM, frame, True))
        await super().startup(sockets=sockets)
        if self.told:
            self.handle_exit(signal.SIGTERM, None, True)
        if self.started and sockets and not self.supervised:
            # uvicorn names no address for sockets it is handed (bound early: listening.bind()): say it here.
            print(ready_message(sockets[0], self.settings), flush=True)

    def handle_exit(self, sig, frame, told: bool = False) -> None:
        if self.supervised and not told and runtime.supervised():
            return None  # the whole group's signal: the supervisor tells each process in turn
        if self._stop_started:
            return super().handle_exit(sig, frame)
        self._stop_started = True
        gateway = getattr(self.app.state, "gateway", None)
        if gateway is None:  # still starting: nothing accepted yet
            self.should_exit = True
            return
        gateway.begin_stopping()
        threading.Thread(target=self._close_after_delay, daemon=True).start()

    def _close_after_delay(self) -> None:
        time.sleep(self.settings.shutdown_delay_s)
        for close in self.closers:  # the gRPC listener closes with the HTTP one
            close()
        # uvicorn closes the listener, lets each open connection finish its request
        # (timeout_graceful_shutdown), and then runs the lifespan's shutdown. Not
        # super().handle_exit(): uvicorn would re-raise the signal once it has shut
        # down, and the process would not exit 0.
        self.should_exit = True


@asynccontextmanager
async def serve_grpc(gateway: Gateway, settings: Settings, shared: bool = False):
    """The gRPC endpoint (grpc.py) when ``grpc_port`` is set, started on the running loop; gives a
    function any thread may call to close its listener (running RPCs get the shutdown grace), or None.
    ``shared``: the port is shared with the other front ends (SO_REUSEPORT)."""
    if not settings.grpc_port:
        yield None
        return
    try:
        from .. import grpc as grpc_service
    except ImportError as exc:
        raise StartupError(f"PLACEENV_GRPC_PORT is set but {exc.name} is not installed: "
                           "pip install 'placeenv[grpc]', or unset it") from None
    try:
        server = await grpc_service.start(gateway, settings, shared)
    except RuntimeError as exc:  # grpc.aio: the port is taken or the address does not bind
        raise StartupError(f"cannot serve gRPC on {settings.host}:{settings.grpc_port}: {exc}") from None
    log.info("Open Inference Protocol over gRPC on %s:%d", settings.host, settings.grpc_port)
    loop, grace = asyncio.get_running_loop(), settings.shutdown_grace_s
    try:
        yield lambda: asyncio.run_coroutine_threadsafe(server.stop(grace), loop)
    finally:  # already closing when the shutdown delay ended
        await server.stop(grace)


def serve(settings: Settings, connect, sock: socket.socket, supervised: bool = False,
          told: list | None = None) -> int:
    """Serve HTTP on ``sock`` (and gRPC with ``--grpc-port``) over ``connect(settings)``'s gateway until
    stopped; 0 once stopped, 1 when it could not start. ``supervised``: a front end, whose gRPC
    port the other front ends share."""
    closers: list = []

    @asynccontextmanager
    async def connect_with_grpc(settings: Settings):
        async with connect(settings) as gateway:
            async with serve_grpc(gateway, settings, shared=supervised) as close:
                if close is not None:
                    closers.append(close)
                yield gateway

    app = create_app(settings, connect_with_grpc)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_graceful_shutdown=settings.shutdown_grace_s, access_log=settings.access_log)
    server = UvicornServer(config, app, settings, supervised=supervised, told=told, closers=closers)
    server.run(sockets=[sock])
    return 0 if server.started else 1
