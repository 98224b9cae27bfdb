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
    from ..engine.engine import Engine  # imports Paddle, which sets its own SIGTERM handler (a fatal error)
    from ..protocol.errors import StartupError

    _take_signals(stopped)  # ours again
    try:
        engine = Engine(settings)
        engine.start()
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        return runtime.CANNOT_START
    log.info("engine: serving %s on %s (isolation %s)", ", ".join(engine.entries), ", ".join(engine.devices),
             settings.isolation)
    return asyncio.run(serve(engine, flags, beats, run, stopped))


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


async def serve(engine, flags: runtime.ReadyFlags, beats: runtime.Heartbeats, run, stopped: list) -> int:
    """Answer the front ends until told to stop (0), or until serving fails (1: the supervisor restarts us)."""
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
    polling = asyncio.ensure_future(engine.control.poll()) if engine.settings.model_control_mode == "poll" else None
    told = asyncio.ensure_future(stop.wait())
    await asyncio.wait([serving, told], return_when=asyncio.FIRST_COMPLETED)
    flags.set(0, False)
    code = 0
    if serving.done():
        log.error("engine: serving the front ends failed: %r", serving.exception())
        code = 1
    log.info("engine: stopping; %d requests received, %d answered", engine.received, engine.answered)
    if polling is not None:
        polling.cancel()
    # Requests in flight finish and are answered; new ones get 503 Draining.
    await asyncio.to_thread(engine.stop)
    serving.cancel()
    told.cancel()
    beating.cancel()
    server.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
