"""The engine process (``--frontends`` K >= 1): every device, model, queue and worker, no HTTP.

Started by the supervisor (supervisor.py) with the service's own arguments. It
loads the models as the single process does (``engine.Engine``), then answers the
front ends over ``link.EngineServer`` until the supervisor's stop signal
(``runtime.STOP``): it then refuses new work, lets its workers finish what they
hold, and exits 0. SIGINT and SIGTERM are the supervisor's to act on (front ends
stop first), so the engine ignores them while the supervisor runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import warnings

from . import runtime
from ..config import Settings

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    stopped = _take_signals()
    runtime.die_with_parent()
    settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
    settings.set_up_process()
    run = runtime.run_dir()
    flags = runtime.ReadyFlags(run / "ready")
    beats = runtime.Heartbeats(run / "beats")
    warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning,
                            module="paddle.utils.cpp_extension.extension_utils")
    if settings.wants_sim():
        import placeenv.sim

        placeenv.sim.prepare(settings.sim_devices)
    from ..engine.engine import running  # imports Paddle, which sets its own SIGTERM handler (a fatal error)

    _take_signals(stopped)  # ours again
    return asyncio.run(serve(running(settings), flags, beats, run, stopped))


def _take_signals(stopped: list | None = None) -> list:
    """From the first line on: the supervisor's stop signal is noted (acted on once serving), and
    SIGINT and SIGTERM, which the whole group may get, are the supervisor's while it runs."""
    stopped = [] if stopped is None else stopped

    def terminate(sig, frame) -> None:
        if not runtime.supervised():  # nobody else will stop us
            stopped.append(sig)

    signal.signal(runtime.STOP, lambda sig, frame: stopped.append(sig))
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return stopped


async def serve(engine_running, flags: runtime.ReadyFlags, beats: runtime.Heartbeats, run, stopped: list) -> int:
    """Start the engine (``engine_running``: ``engine.running(settings)``), then answer the front ends until
    told to stop (0), or until serving fails (1: the supervisor restarts us); ``CANNOT_START`` when the
    engine cannot start."""
    from ..protocol.errors import StartupError

    closing: list = []  # what answers the front ends: let go of once the engine has stopped
    try:
        # At the end of ``async with``, requests in flight finish and are answered (the link still sends
        # their answers); new ones get 503 Draining.
        async with engine_running as engine:
            catalog = engine.catalog()
            log.info("engine: serving %s on %s (isolation %s)", ", ".join(catalog.models),
                     ", ".join(catalog.devices), engine.settings.isolation)
            return await answer_front_ends(engine, flags, beats, run, stopped, closing)
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        return runtime.CANNOT_START
    finally:
        for close in closing:
            close()


async def answer_front_ends(engine, flags: runtime.ReadyFlags, beats: runtime.Heartbeats, run, stopped: list,
                            closing: list) -> int:
    """Serve the link until told to stop (0) or until serving fails (1); ``closing`` gets what ends the
    link's tasks and closes it, for after the engine has stopped."""
    from .link import endpoint
    from .link_server import EngineServer

    server = EngineServer(engine, endpoint(str(run)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(runtime.STOP, stop.set)
    loop.add_signal_handler(signal.SIGTERM, lambda: None if runtime.supervised() else stop.set())
    if stopped:  # told before the loop ran
        stop.set()
    server.bind()  # before the flag: a front end that sees it can connect
    beating = asyncio.ensure_future(runtime.beating(beats, 0))
    flags.set(0, True)
    serving = asyncio.ensure_future(server.serve())
    told = asyncio.ensure_future(stop.wait())
    closing += [serving.cancel, told.cancel, beating.cancel, server.close]
    await asyncio.wait([serving, told], return_when=asyncio.FIRST_COMPLETED)
    flags.set(0, False)
    if serving.done():
        log.error("engine: serving the front ends failed: %r", serving.exception())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
