"""The one layer every protocol hands its requests to: read, check, count, run, answer.

A ``Gateway`` lives in each process that serves a protocol: the single process
(``--frontends 0``) or each front end. ``infer`` is the one way in for an inference
request: the protocol's adapter names the model and reads its tensors, and the
gateway resolves the model, checks the request against the engine's ``Catalog``
(every 400 and 404 is decided in this process, before anything crosses to the
engine), stamps its deadline (the shorter of the client's and the service's) and its priority,
counts its answer once in ``inference_requests_total``
by outcome (``errors.OUTCOMES``), and runs it on its ``engine``: ``LocalEngine``
(engine/local.py, the engine in this process) or ``link.EngineClient`` (the engine
process). The metadata both protocols answer (server, model, config, repository
index, readiness, statistics) is read here too. No Paddle is imported here.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .. import metrics
from . import triton
from .errors import OK_LABEL, OUTCOMES, Cancelled, InvalidInput, ModelFailed, ServiceError, Timeout, outcome
from .request import Catalog, InferRequest, ModelInfo, Result, VersionInfo, Work, check_parameters, terms
from .wire import prefix

VERSION = importlib.metadata.version("placeenv")


class EngineHandle(Protocol):
    """What a gateway holds of the engine, wherever it runs."""

    catalog: Catalog

    async def run(self, work: Work, arrays: dict[str, np.ndarray]) -> Result:
        """The request's result; cancelled (its caller's task), it withdraws the request from the engine."""

    async def status(self) -> dict[str, Any]: ...

    async def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]: ...

    async def load(self, name: str) -> None: ...

    async def unload(self, name: str, dependents: bool = False) -> None: ...


#: An adapter's reading of a request: ``identify()`` gives the (model, version) the client named;
#: ``read(model, version)`` the request, once the model's tensors are known (they say how to read it).
Identify = Callable[[], tuple[Any, Any]]
Read = Callable[[ModelInfo, VersionInfo], InferRequest]


class Gateway:
    def __init__(self, settings, engine: EngineHandle, peers_ready=None, on_stopping=None) -> None:
        self.settings, self.engine = settings, engine
        self.inline_bytes = settings.inline_preprocess_bytes
        self.timeout_s = settings.request_timeout_s
        self.peers_ready = peers_ready  # every process's readiness (the supervisor's flags), or None
        self.on_stopping = on_stopping  # tells the other processes this one is stopping, or None
        self.stopping = False  # SIGTERM arrived: not ready, still serving until the listener closes

    @property
    def catalog(self) -> Catalog:
        return self.engine.catalog

    # -- inference ---------------------------------------------------------------------------

    async def infer(self, identify: Identify, read: Read, model: Any = None) -> Result:
        """Read the request, check it, run it on the engine and count its answer; a ``ServiceError``
        (counted, ``counted`` set) when it has none, or the exception of a bug (counted as "error").
        ``model``: the name the request gave before its body is read (a path's), for the label of a
        refusal that comes before ``identify`` names it."""
        name, arrived = model, None
        try:
            name, version = identify()
            model, chosen = self.catalog.resolve(name, version)
            request = read(model, chosen)
            arrived = request.arrived
            deadline = request.arrived + self.timeout_s
            if request.timeout is None and request.priority is None and request.expires is None and \
                    request.parameters is None:
                work, arrays = self.catalog.check(request, model, chosen, self.inline_bytes, deadline)
            else:  # the client's own terms (a deadline, a priority) and its parameters for the model
                deadline, own, priority = terms(request, deadline)
                work, arrays = self.catalog.check(request, model, chosen, self.inline_bytes, deadline, priority,
                                                  own, check_parameters(request.parameters))
            metrics.ON_LOOP.in_flight += 1
            try:
                result = await self.engine.run(work, arrays)
            finally:
                metrics.ON_LOOP.in_flight -= 1
        except asyncio.CancelledError:
            # The client left (an HTTP disconnect, a cancelled gRPC call; the engine handle withdrew the
            # job): counted once, as every answer is, and the cancellation goes on up. A gRPC call
            # cancelled by its own deadline is that deadline's 504.
            late = time.perf_counter() >= work.deadline
            self.refuse(Timeout("the request's deadline passed") if late else Cancelled("the client left"), name)
            raise
        except ServiceError as exc:
            self.refuse(exc, name, arrived)
            raise
        except Exception:  # a bug of ours: answered 500 / INTERNAL by the protocol, counted as one
            metrics.ON_LOOP.count(self._label(name), "none", OUTCOMES[ModelFailed].label)
            raise
        label = self._label(name)
        metrics.ON_LOOP.count(label, result.device, OK_LABEL)
        metrics.ON_LOOP.observe(metrics.ON_LOOP.durations, (label, result.device),
                                time.perf_counter() - request.arrived)
        return result

    def refuse(self, error: ServiceError, model: Any = None, arrived: float | None = None) -> None:
        """Count an inference request answered with ``error``: by ``infer``, or by a protocol's router
        for what it refuses before reading a request (a body over the limit, a method the path does
        not take). The model label is a served model's name or "unknown". A request read (``arrived``
        known) and turned away to retry later is timed too: shedding load must not wait for passes."""
        label, found = self._label(model), outcome(error)
        metrics.ON_LOOP.count(label, error.device, found.label)
        if arrived is not None and found.retry:
            metrics.ON_LOOP.observe(metrics.ON_LOOP.refusals, (label, found.label), time.perf_counter() - arrived)
        error.counted = True

    def _label(self, model: Any) -> str:
        """The model label of a request's metrics: a served model's name, or "unknown" (bounded)."""
        return model if isinstance(model, str) and model in self.catalog.models else "unknown"

    # -- what both protocols say of the server and its models ---------------------------------

    @staticmethod
    def server_metadata() -> dict[str, Any]:
        return {"name": "placeenv", "version": VERSION,
                "extensions": ["binary_tensor_data", "model_configuration", "model_repository", "statistics"]}

    def model_metadata(self, name: Any, version: Any = None) -> dict[str, Any]:
        """A model version's metadata; ``UnknownModel`` or ``NotReady`` naming what exists."""
        model, chosen = self.catalog.resolve(name, version)
        return {
            "name": model.name, "versions": [str(v) for v in sorted(model.versions)], "platform": chosen.platform,
            "inputs": [s.describe() for s in chosen.inputs], "outputs": [s.describe() for s in chosen.outputs],
        }

    def model_config(self, name: Any, version: Any = None) -> dict[str, Any]:
        """Triton's ``ModelConfig`` of a model version (protocol/triton.py); ``UnknownModel`` or ``NotReady``."""
        model, chosen = self.catalog.resolve(name, version)
        return triton.model_config(model, chosen, self.catalog.devices, self.settings.workers_per_device)

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every served version, every model that could not be loaded (or whose last load failed, beside
        the versions it serves), and with model control every other model of the repositories."""
        catalog, ready = self.catalog, await self.ready()
        rows = [{"name": m.name, "version": str(v), "state": "READY" if ready else "UNAVAILABLE"}
                for m in catalog.models.values() for v in sorted(m.versions)]
        rows += [{"name": name, "state": "UNAVAILABLE", "reason": why[:300]} for name, why in catalog.skipped.items()]
        rows += [{"name": name, "state": "UNAVAILABLE", "reason": f"the last load failed: {why}"[:300]}
                 for name, why in catalog.load_errors.items()]
        if catalog.control != "none":
            listed = {r["name"] for r in rows}
            rows += [{"name": name, "state": "UNAVAILABLE", "reason": "unloaded"}
                     for name in self.settings.model_directories() if name not in listed]
        if ready_only:
            rows = [r for r in rows if r["state"] == "READY"]
        return sorted(rows, key=lambda r: r["name"])

    async def load_model(self, name: Any, parameters: dict[str, Any] | None = None) -> None:
        """Load ``name`` from the repositories (model control explicit); answered once it serves. No
        parameter is taken: Triton's carry a config or files ("config", "file:<path>"), and a load here
        reads only the configured repositories."""
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"model name {prefix(name)} is not a name; send the name of a model directory "
                               "of the repository")
        given = [k for k in (parameters or {})]
        if given:
            raise InvalidInput(f"load parameter {prefix(given[0])} is not taken: this service loads only from "
                               "its configured repositories (PLACEENV_MODEL_REPOSITORY), never a config or file "
                               "sent with the request; put the files there and send the load without parameters")
        await self.engine.load(name)

    async def unload_model(self, name: Any, parameters: dict[str, Any] | None = None) -> None:
        """Stop serving ``name`` (model control explicit): answered once its requests drained."""
        parameters = parameters or {}
        unknown = [k for k in parameters if k != "unload_dependents"]
        if unknown:
            raise InvalidInput(f"unload parameter {prefix(unknown[0])} is not taken; the one parameter is "
                               "unload_dependents (true or false)")
        dependents = parameters.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidInput(f"unload_dependents is {prefix(dependents)}; send true or false")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"model name {prefix(name)} is not a name")
        await self.engine.unload(name, dependents)

    async def statistics(self, model: Any = None, version: Any = None) -> list[dict]:
        """Triton's statistics, kept by the engine: every version's, ``model``'s (its every version when
        ``version`` is None), or one version's."""
        if model is None:
            return await self.engine.statistics()
        found, chosen = self.catalog.resolve(model, version)
        return await self.engine.statistics(found.name, chosen.number if version is not None else None)

    async def status(self) -> dict[str, Any]:
        """Readiness: the engine's (every worker started), this process's, and its peers'."""
        found = await self.engine.status()
        peers = True if self.peers_ready is None else self.peers_ready()
        return {**found, "ready": found["ready"] and not self.stopping and peers,
                "stopping": found.get("stopping", False) or self.stopping}

    async def ready(self) -> bool:
        return (await self.status())["ready"]

    async def model_ready(self, name: Any, version: Any = None) -> tuple[ModelInfo, VersionInfo, bool]:
        """The model and version named, and whether they are ready; ``UnknownModel`` or ``NotReady``."""
        model, chosen = self.catalog.resolve(name, version)
        return model, chosen, await self.ready()

    def begin_stopping(self) -> None:
        """Readiness off; requests are still served (a load balancer needs time to stop routing here).
        An engine in this process stops being ready too; the engine process has its own signal."""
        self.stopping = True
        for stop in (getattr(self.engine, "begin_stopping", None), self.on_stopping):
            if stop is not None:
                stop()
