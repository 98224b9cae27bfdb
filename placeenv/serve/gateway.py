"""The one place every adapter hands its ``InferRequest`` to: check, count, time, run, answer.

A ``Gateway`` lives in each process that serves a protocol: the single process
(``--frontends 0``) or each front end. It checks the request against the
engine's ``Catalog`` (with the adapters, which look the model up in it to read the
body, every 400 and 404 is decided in this process, before anything crosses to
the engine), counts each answer once in ``inference_requests_total`` by its
outcome (``errors.OUTCOMES``), and runs the checked request on its ``engine``:
``LocalEngine`` (a ``core.Service`` in this process) or ``link.EngineClient`` (the
engine process). No Paddle is imported here.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from . import metrics
from .errors import OK_LABEL, ServiceError, outcome
from .request import Catalog, InferRequest, Result, Work


class Engine(Protocol):
    """What a gateway needs of the engine, wherever it runs."""

    catalog: Catalog

    async def run(self, work: Work, arrays: dict[str, np.ndarray]) -> Result: ...

    async def status(self) -> dict[str, Any]: ...

    async def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]: ...


class LocalEngine:
    """The engine in this process: a started ``core.Service``; the hop is a function call."""

    def __init__(self, service) -> None:
        self.service = service
        self.catalog: Catalog = service.catalog()

    async def run(self, work: Work, arrays: dict[str, np.ndarray]) -> Result:
        return await self.service.run(work, arrays)

    async def status(self) -> dict[str, Any]:
        return self.service.status()

    async def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]:
        return self.service.statistics(model, version)

    def begin_stopping(self) -> None:
        self.service.begin_stopping()


class Gateway:
    def __init__(self, settings, engine: Engine, peers_ready=None, on_stopping=None) -> None:
        self.settings, self.engine = settings, engine
        self.inline_bytes = settings.inline_preprocess_bytes
        self.peers_ready = peers_ready  # every process's readiness (the supervisor's flags), or None
        self.on_stopping = on_stopping  # tells the other processes this one is stopping, or None
        self.stopping = False  # SIGTERM arrived: not ready, still serving until the drain

    @property
    def catalog(self) -> Catalog:
        return self.engine.catalog

    async def infer(self, request: InferRequest) -> Result:
        """Check ``request``, run it on the engine, count its answer; ``ServiceError`` when it has none."""
        label = self._label(request.model)
        try:
            work, arrays = self.catalog.check(request, self.inline_bytes)
            metrics.ON_LOOP.in_flight += 1
            try:
                result = await self.engine.run(work, arrays)
            finally:
                metrics.ON_LOOP.in_flight -= 1
        except ServiceError as exc:
            metrics.ON_LOOP.count(label, getattr(exc, "device", "none"), outcome(exc).label)
            raise
        metrics.ON_LOOP.count(label, result.device, OK_LABEL)
        metrics.ON_LOOP.observe(metrics.ON_LOOP.durations, (label, result.device),
                                time.perf_counter() - request.arrived)
        return result

    def refused(self, model: Any, error: ServiceError) -> None:
        """Count a request an adapter refused before ``infer`` (a body that does not parse). The model
        label is a served model's name or "unknown"."""
        metrics.ON_LOOP.count(self._label(model), "none", outcome(error).label)

    def _label(self, model: Any) -> str:
        """The model label of a request's metrics: a served model's name, or "unknown" (bounded)."""
        return model if isinstance(model, str) and model in self.catalog.models else "unknown"

    async def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]:
        """Triton's statistics, kept by the engine: every version's, ``model``'s, or one version's."""
        return await self.engine.statistics(model, version)

    async def status(self) -> dict[str, Any]:
        """Readiness: the engine's (every worker started), this process's, and its peers'."""
        found = await self.engine.status()
        peers = True if self.peers_ready is None else self.peers_ready()
        return {**found, "ready": found["ready"] and not self.stopping and peers,
                "stopping": found.get("stopping", False) or self.stopping}

    async def ready(self) -> bool:
        return (await self.status())["ready"]

    async def model_ready(self, name: str) -> bool:
        return name in self.catalog.models and await self.ready()

    def begin_stopping(self) -> None:
        """Readiness off; requests are still served (a load balancer needs time to stop routing here).
        An engine in this process stops being ready too; the engine process has its own signal."""
        self.stopping = True
        for stop in (getattr(self.engine, "begin_stopping", None), self.on_stopping):
            if stop is not None:
                stop()
