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
    """uvicorn with a drain before exit.

    On SIGTERM/SIGINT: readiness turns false, new predicts get 503, accepted
    requests finish (up to ``shutdown_grace_s``), then uvicorn stops and the
    lifespan joins the workers. A second signal exits at once.
    """

    def __init__(self, config: uvicorn.Config, app, settings: Settings) -> None:
        super().__init__(config)
        self.app, self.settings = app, settings
        self._drain_started = False

    def handle_exit(self, sig, frame) -> None:
        if self._drain_started:
            return super().handle_exit(sig, frame)
        self._drain_started = True
        service = getattr(self.app.state, "service", None)
        if service is None:  # still starting: nothing accepted yet
            self.should_exit = True
            return
        service.begin_drain()
        threading.Thread(target=self._exit_when_idle, args=(service,), daemon=True).start()

    def _exit_when_idle(self, service) -> None:
        start = time.monotonic()
        deadline = start + max(self.settings.shutdown_grace_s, self.settings.shutdown_delay_s)
        while time.monotonic() < start + self.settings.shutdown_delay_s:
            time.sleep(0.02)
        while not service.idle() and time.monotonic() < deadline:
            time.sleep(0.02)
        # Not super().handle_exit(): uvicorn would re-raise the signal once it
        # has shut down, and the process would not exit 0.
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
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port,
        log_level=settings.log_level, timeout_graceful_shutdown=settings.shutdown_grace_s, access_log=False,
    )
    server = DrainingServer(config, app, settings)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
