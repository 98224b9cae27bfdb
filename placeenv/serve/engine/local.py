"""The engine in this process (``--frontends 0``), as a gateway holds it: the hop is a function call."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from ..protocol.gateway import Gateway
from ..protocol.request import Catalog, Result, Work
from .engine import Engine, running


class LocalEngine:
    """A started ``Engine``, as the gateway's ``EngineHandle``; requests go in by ``Engine.submit``, the
    engine process's way in too (process/link.py)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.catalog: Catalog = engine.catalog()
        engine.publishers.append(self._publish)  # a load's or an unload's new catalog, in the loop's turn

    def _publish(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def run(self, work: Work, arrays: dict[str, np.ndarray]) -> Result:
        future = asyncio.get_running_loop().create_future()

        def done(result: Result | None, error: BaseException | None) -> None:
            if future.done():  # the caller went away (its task was cancelled)
                return
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

        handle = self.engine.submit(work, arrays, done)
        try:
            return await future
        except asyncio.CancelledError:  # the client left: the engine withdraws its job
            if handle is not None:
                handle.cancel()
            raise

    async def status(self) -> dict[str, Any]:
        return self.engine.status()

    async def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]:
        return self.engine.statistics(model, version)

    async def load(self, name: str) -> None:
        await self.engine.load(name)

    async def unload(self, name: str, dependents: bool = False) -> None:
        await self.engine.unload(name, dependents)

    def begin_stopping(self) -> None:
        self.engine.begin_stopping()


@asynccontextmanager
async def local_gateway(settings):
    """The models, devices and workers in this process, and the gateway over them, for the app's life."""
    async with running(settings) as engine:
        yield Gateway(settings, LocalEngine(engine))
