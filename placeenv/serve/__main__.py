"""``python -m placeenv.serve`` (console script ``placeenv-serve``): run the inference service.

Settings come from ``PLACEENV_*`` variables and matching ``--flags``. When the
devices are sim devices (or 'auto' on a machine without an accelerator), the
sim plugin is prepared here, before Paddle is imported.
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import sys
import threading
import time
import warnings
from pathlib import Path

import uvicorn

from .config import Settings


class DrainingServer(uvicorn.Server):
    """uvicorn with the shutdown sequence a load balancer needs.

    On SIGTERM/SIGINT:
    1. readiness turns false at once, and requests are still served for
       ``shutdown_delay_s``: the load balancer or the Kubernetes endpoints stop
       routing here meanwhile, so nothing is refused that was already on its way;
    2. the listener closes (and the gRPC one, when served): a proxy's new
       connections are refused, which it can retry elsewhere as nothing was sent;
       idle keep-alive connections close;
    3. accepted requests finish, up to ``shutdown_grace_s``; then the lifespan
       joins the workers (queued work not started by then gets 503 Draining) and
       the process exits 0.
    A second signal during the delay skips the rest of it.
    """

    def __init__(self, config: uvicorn.Config, app, settings: Settings, supervised: bool = False,
                 told: list | None = None) -> None:
        super().__init__(config)
        self.app, self.settings = app, settings
        # A front end: the supervisor says where the service listens, and when to stop (runtime.STOP);
        # ``told`` holds a stop that came before this server took the signal.
        self.supervised, self.told = supervised, told or []
        self._stop_started = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.supervised:
            from . import runtime

            signal.signal(runtime.STOP, lambda sig, frame: self.handle_exit(signal.SIGTERM, frame, True))
        await super().startup(sockets=sockets)
        if self.told:
            self.handle_exit(signal.SIGTERM, None, True)
        if self.started and sockets and not self.supervised:
            # uvicorn names no address for sockets it is handed (bound early: bind()), so say it here.
            print(ready_message(sockets[0], self.settings), flush=True)

    def handle_exit(self, sig, frame, told: bool = False) -> None:
        if self.supervised and not told:
            from . import runtime

            if runtime.supervised():  # the whole group's signal: the supervisor tells each process in turn
                return None
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
        close_grpc = getattr(self.app.state, "close_grpc", None)
        if close_grpc is not None:  # the gRPC listener closes with the HTTP one
            close_grpc()
        # uvicorn closes the listener, lets each open connection finish its request
        # (timeout_graceful_shutdown), and then runs the lifespan's shutdown. Not
        # super().handle_exit(): uvicorn would re-raise the signal once it has shut
        # down, and the process would not exit 0.
        self.should_exit = True


def program_name() -> str:
    """How the user called us, for --help and messages: the console script or the module."""
    name = Path(sys.argv[0]).name
    return name if name == "placeenv-serve" else "python -m placeenv.serve"


def address(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ready_message(sock: socket.socket, settings: Settings) -> str:
    """The line that says where the started service listens (the bound port: --port 0 picks one)."""
    http = f"http://{address(settings.host, sock.getsockname()[1])}"
    grpc = f"; gRPC on {address(settings.host, settings.grpc_port)}" if settings.grpc_port else ""
    return f"placeenv.serve: ready on {http} (API docs: {http}/docs){grpc}"


def bind(host: str, port: int) -> socket.socket:
    """The HTTP listening socket, bound before any model loads, so a port in use costs no start-up.

    SO_REUSEADDR as uvicorn sets it: a port in TIME_WAIT after a restart binds; a port
    another process listens on does not.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def check_free(host: str, port: int) -> None:
    """Refuse a gRPC port in use now, not after the models load (grpc.aio binds it at start-up)."""
    bind(host, port).close()


def refuse(program: str, host: str, port: int, error: OSError, flag: str, variable: str) -> int:
    """One line naming the port and the setting to change; exit status 2, a usage error (as argparse's)."""
    if error.errno == errno.EADDRINUSE:
        advice = f"the port is already in use (another server?); choose another with {flag} or {variable}"
    else:  # a port below 1024 without the privilege, an address not on this machine, an unknown host
        advice = f"{error.strerror or error}; check --host and {flag}"
    print(f"{program}: cannot listen on {host}:{port}: {advice}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    program = program_name()
    settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv, _cli_prog_name=program)
    settings.set_up_process()
    try:
        sock = bind(settings.host, settings.port)
    except OSError as error:
        return refuse(program, settings.host, settings.port, error, "--port", "PLACEENV_PORT")
    if settings.grpc_port:
        try:
            check_free(settings.host, settings.grpc_port)
        except OSError as error:
            sock.close()
            return refuse(program, settings.host, settings.grpc_port, error, "--grpc-port",
                          "PLACEENV_GRPC_PORT")
    if settings.frontend_count():
        from .supervisor import Supervisor  # imports neither Paddle nor the app

        args = sys.argv[1:] if argv is None else argv
        return Supervisor(settings, sock, args, lambda: ready_message(sock, settings)).serve()
    # Paddle warns at import that ccache is missing: it matters to people who build Paddle's
    # C++ extensions, not to a server.
    warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning,
                            module="paddle.utils.cpp_extension.extension_utils")
    if settings.wants_sim():
        import placeenv.sim

        placeenv.sim.prepare(settings.sim_devices)
    from .app import create_app  # imports Paddle: after the sim set-up

    app = create_app(settings)
    logging.getLogger(__name__).info("GIL switch interval %g ms", sys.getswitchinterval() * 1000)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port,
        log_level=settings.log_level, timeout_graceful_shutdown=settings.shutdown_grace_s,
        access_log=settings.access_log,
    )
    server = DrainingServer(config, app, settings)
    server.run(sockets=[sock])
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
