"""Where the service listens: the sockets bound before any model loads, and the line that says where.

The command line (cli.py) and the HTTP server (server.py) both use them, and cli.py starts server.py:
with them here, server.py does not import cli.py back.
"""

from __future__ import annotations

import socket

from ..config import Settings


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ready_message(sock: socket.socket, settings: Settings) -> str:
    """The line that says where the started service listens (the bound port: --port 0 picks one)."""
    http = f"http://{host_port(settings.host, sock.getsockname()[1])}"
    grpc = f"; gRPC on {host_port(settings.host, settings.grpc_port)}" if settings.grpc_port else ""
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
