"""A front-end process (``--frontends`` K >= 1): HTTP and gRPC, the engine in another process.

Started by the supervisor (supervisor.py) with the service's own arguments. It serves
the same app as the single process, on the HTTP socket the supervisor bound (inherited,
so the K front ends share it and the kernel spreads connections among them) and, with
``--grpc-port``, on that port shared with SO_REUSEPORT (server.py). Its gateway checks each
request against the engine's catalog and sends it over ``link.EngineClient``. Paddle is not
imported here: preprocessing runs in the engine, under ``@PlaceEnv('cpu')``, where the
place checks see it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from contextlib import asynccontextmanager

from . import runtime
from ..config import Settings

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    # Until uvicorn takes them: the supervisor's stop is noted (acted on once serving), and SIGINT
    # and SIGTERM, which the whole group may get, are the supervisor's while it runs.
    told: list[int] = []
    signal.signal(runtime.STOP, lambda sig, frame: told.append(sig))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda sig, frame: None if runtime.supervised() else sys.exit(1))
    runtime.die_with_parent()
    settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
    settings.set_up_process()
    index = int(os.environ[runtime.FRONTEND_INDEX])
    sock = socket.socket(fileno=int(os.environ[runtime.LISTEN_FD]))
    run = runtime.run_dir()
    flags = runtime.ReadyFlags(run / "ready")
    beats = runtime.Heartbeats(run / "beats")

    from .. import metrics
    from ..protocol.gateway import Gateway
    from .link import EngineClient, endpoint
    from .server import serve

    @asynccontextmanager
    async def connect(settings: Settings):
        def stopping() -> None:
            flags.set(index + 1, False)
            metrics.READY.set(0)

        client = EngineClient(endpoint(str(run)))
        await client.connect()
        gateway = Gateway(settings, client, peers_ready=flags.all, on_stopping=stopping)
        def changed(up: bool) -> None:
            # The engine's own vote leaves with its process (metrics.process_dead): this one says it is gone.
            # Its flag goes too, so that no front end says the service is ready (every flag) while another
            # still refuses requests, its link to a new engine not yet up.
            ready = up and not gateway.stopping
            flags.set(index + 1, ready)
            metrics.READY.set(1 if ready else 0)

        client.on_change = changed
        beating = asyncio.ensure_future(runtime.beating(beats, index + 1))
        changed(True)  # service_ready is the lowest of every process's (metrics.py)
        try:
            yield gateway
        finally:
            stopping()
            beating.cancel()
            await client.close()

    return serve(settings, connect, sock, supervised=True, told=told)


if __name__ == "__main__":
    sys.exit(main())
