"""``python -m placeenv.serve`` (console script ``placeenv-serve``): run the inference service.

Settings come from ``PLACEENV_*`` variables and matching ``--flags``. The ports are
bound (or refused) before any model loads. With ``--frontends K`` the supervisor
takes over (supervisor.py); else this process is the whole service: when the
devices are sim devices (or 'auto' on a machine without an accelerator), the sim
plugin is prepared here, before Paddle is imported, and the engine runs here.
"""

from __future__ import annotations

import errno
import logging
import sys
import warnings
from pathlib import Path

from ..config import Settings
from .listening import bind, check_free, ready_message


def program_name() -> str:
    """How the user called us, for --help and messages: the console script or the module."""
    name = Path(sys.argv[0]).name
    return name if name == "placeenv-serve" else "python -m placeenv.serve"


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
    # Imports Paddle: after the sim set-up, and before uvicorn installs its signal handlers (Paddle's
    # import installs its own SIGTERM handler, a fatal error).
    from ..engine.local import local_gateway
    from .server import serve

    logging.getLogger(__name__).info("GIL switch interval %g ms", sys.getswitchinterval() * 1000)
    return serve(settings, local_gateway, sock)
