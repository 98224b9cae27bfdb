"""``python -m placeenv.serve`` (console script ``placeenv-serve``): run the inference service.

Settings come from ``PLACEENV_*`` variables and matching ``--flags``. When the
devices are sim devices (or 'auto' on a machine without an accelerator), the
sim plugin is prepared here, before Paddle is imported.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

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

    def __init__(self, config: uvicorn.Config, app, settings: Settings) -> None:
        super().__init__(config)
        self.app, self.settings = app, settings
        self._stop_started = False

    def handle_exit(self, sig, frame) -> None:
        if self._stop_started:
            return super().handle_exit(sig, frame)
        self._stop_started = True
        service = getattr(self.app.state, "service", None)
        if service is None:  # still starting: nothing accepted yet
            self.should_exit = True
            return
        service.begin_stopping()
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


def main(argv: list[str] | None = None) -> int:
    settings = Settings(
        _cli_parse_args=sys.argv[1:] if argv is None else argv, _cli_prog_name="python -m placeenv.serve"
    )
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.wants_sim():
        import placeenv.sim

        placeenv.sim.prepare(settings.sim_devices)
    from .app import create_app  # imports Paddle: after the sim set-up

    app = create_app(settings)
    # Process-wide, so set by the program, not by create_app: measured in docs/benchmarks.md
    # (the front end's ceiling), 5 ms turns cost a small model a fifth of its throughput.
    sys.setswitchinterval(settings.gil_switch_interval_ms / 1000)
    logging.getLogger(__name__).info("GIL switch interval %g ms", sys.getswitchinterval() * 1000)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port,
        log_level=settings.log_level, timeout_graceful_shutdown=settings.shutdown_grace_s, access_log=False,
    )
    server = DrainingServer(config, app, settings)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
