"""The link between front ends and the engine: ZeroMQ over ipc, msgpack headers, arrays as raw frames.

Each front end holds one DEALER socket (``EngineClient``); the engine one ROUTER
(``EngineServer``). A message is a kind frame, a msgpack header (msgspec) and, for
requests and results, one frame per array: its buffer as it lies in memory, never
pickled, received without a copy (``np.frombuffer`` over ZeroMQ's frame).

    front end -> engine   b"R" run (id, Work, tensors) + arrays | b"S" status | b"T" statistics | b"C" catalog
    engine -> front end   b"r" result + arrays | b"e" error | b"s" / b"t" / b"c" the answers

Every request a front end sends is answered exactly once: by the engine, or, when
the engine process goes away (ZeroMQ's monitor sees the ipc connection drop) or
stays silent past the request's deadline, by the front end itself.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import msgspec
import numpy as np
import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from . import errors
from .errors import EngineUnavailable, ModelFailed, Overloaded, ServiceError, Timeout
from .request import Catalog, Result, Work

log = logging.getLogger(__name__)

#: (name, numpy dtype string, shape) of each array frame.
Tensors = list[tuple[str, str, tuple[int, ...]]]


class RunHeader(msgspec.Struct, array_like=True):
    id: int
    work: Work
    tensors: Tensors


class ResultHeader(msgspec.Struct, array_like=True):
    id: int
    model: str
    version: int
    datatypes: dict[str, str]
    device: str
    worker: str
    batch_size: int
    batched: bool
    timings: dict[str, float]
    tensors: Tensors


class ErrorHeader(msgspec.Struct, array_like=True):
    id: int
    kind: str  # the ServiceError class's name (errors.py)
    message: str
    device: str


class Query(msgspec.Struct, array_like=True):
    id: int
    model: str | None = None
    version: int | None = None


class Answer(msgspec.Struct, array_like=True):
    id: int
    value: Any


_encode = msgspec.msgpack.Encoder().encode
_run = msgspec.msgpack.Decoder(RunHeader)
_result = msgspec.msgpack.Decoder(ResultHeader)
_error = msgspec.msgpack.Decoder(ErrorHeader)
_query = msgspec.msgpack.Decoder(Query)
_answer = msgspec.msgpack.Decoder(Answer)

#: The errors an engine may answer with, by name: each crosses as its class and message.
_ERRORS = {cls.__name__: cls for cls in errors.OUTCOMES}


def arrays_out(arrays) -> tuple[Tensors, list[np.ndarray]]:
    """Each array's description and its contiguous buffer, to send as frames."""
    tensors, buffers = [], []
    for name, array in arrays.items():
        array = np.require(array, requirements="C")  # not ascontiguousarray: it makes a 0-d array 1-d
        tensors.append((name, array.dtype.str, array.shape))
        buffers.append(array)
    return tensors, buffers


def arrays_in(tensors: Tensors, frames) -> dict[str, np.ndarray]:
    """The arrays over the received frames' memory (read-only, no copy)."""
    return {name: np.frombuffer(frame.buffer if isinstance(frame, zmq.Frame) else frame, dtype).reshape(shape)
            for (name, dtype, shape), frame in zip(tensors, frames)}


def send_now(socket: zmq.asyncio.Socket, frames: list) -> bool:
    """Send ``frames`` without waiting; False when they cannot go now. Through the asyncio socket (not
    a plain one over it), which then looks again for messages to read: a send can take the edge
    of ZeroMQ's notification that a reader waits on."""
    sent = socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)  # done at once with NOBLOCK
    error = sent.exception()
    if isinstance(error, zmq.Again):
        return False
    if error is not None:
        raise error
    return True


def address(run_dir: str) -> str:
    return f"ipc://{run_dir}/engine.sock"


class EngineClient:
    """A front end's side of the link: ``run`` a checked request on the engine, ask its status."""

    def __init__(self, endpoint: str, settings) -> None:
        self.endpoint, self.settings = endpoint, settings
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.DEALER)
        # Nothing queues for an engine that is not there: a send then fails at once, and is answered.
        self.socket.setsockopt(zmq.IMMEDIATE, 1)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.pending: dict[int, asyncio.Future] = {}
        self.limit = 0  # set with the catalog: see connect()
        self.ids = itertools.count(1)
        self.catalog: Catalog | None = None
        self.up = False
        self.connection = 0  # counts the engine connection's changes
        self.on_change = None  # called with True / False when the engine comes / goes
        self._tasks: list[asyncio.Task] = []

    async def connect(self) -> None:
        """Connect, and wait for the engine's catalog (the engine answers once its workers are up)."""
        monitor = self.socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.socket.connect(self.endpoint)
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._watch(monitor))]
        while self.catalog is None:
            try:
                self.catalog = await self._fetch_catalog(timeout=1.0)
            except EngineUnavailable:
                await asyncio.sleep(0.05)  # the engine is still starting: its socket is not bound yet
            except Timeout:
                continue  # bound, still loading its models
        # A stalled engine cannot grow this process: past what the engine itself can hold (every
        # device's queue full and every worker on a full batch), a request gets 503 here, as the
        # engine would answer it.
        settings = self.settings
        self.limit = len(self.catalog.devices) * (
            settings.queue_capacity + settings.workers_per_device * settings.max_batch_size)
        self.up = True

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._fail_all(EngineUnavailable("the front end is shutting down"))
        self.context.destroy(linger=0)  # every socket of ours: the link's and its monitor

    # -- requests ----------------------------------------------------------------------------

    async def run(self, work: Work, arrays: dict[str, np.ndarray]) -> Result:
        if not self.up:
            raise EngineUnavailable("the engine process is restarting; retry later")
        if len(self.pending) >= self.limit:
            raise Overloaded("too many requests wait on the engine; retry later")
        tensors, buffers = arrays_out(arrays)
        ident = next(self.ids)
        loop = asyncio.get_running_loop()
        future = self.pending[ident] = loop.create_future()
        # The engine answers 504 at the deadline; this answers if the engine cannot.
        timer = loop.call_later(
            max(0.0, work.arrived + self.settings.request_timeout_s + 1.0 - time.perf_counter()), self._expire, ident)
        try:
            self._send([b"R", _encode(RunHeader(ident, work, tensors)), *buffers])
            header, frames = await future
        finally:
            timer.cancel()
            self.pending.pop(ident, None)
        return Result(header.model, header.version, arrays_in(header.tensors, frames), header.datatypes,
                      header.device, header.worker, header.batch_size, header.batched, header.timings)

    async def status(self) -> dict[str, Any]:
        if not self.up:
            return {"ready": False, "stopping": False, "engine": "restarting"}
        try:
            return _answer.decode(await self._ask(b"S", None, timeout=2.0)).value
        except ServiceError as exc:  # an engine that does not answer in time is not ready
            return {"ready": False, "stopping": False, "engine": str(exc)}

    async def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]:
        return _answer.decode(await self._ask(b"T", (model, version), timeout=5.0)).value

    async def _fetch_catalog(self, timeout: float) -> Catalog:
        return msgspec.convert(_answer.decode(await self._ask(b"C", None, timeout)).value, Catalog)

    async def _ask(self, kind: bytes, query, timeout: float) -> bytes:
        ident = next(self.ids)
        future = self.pending[ident] = asyncio.get_running_loop().create_future()
        model, version = query or (None, None)
        try:
            self._send([kind, _encode(Query(ident, model, version))])
            header, _ = await asyncio.wait_for(future, timeout)
            return header
        except asyncio.TimeoutError:
            raise Timeout(f"the engine did not answer within {timeout:g} s") from None
        finally:
            self.pending.pop(ident, None)

    def _send(self, frames: list) -> None:
        if not send_now(self.socket, frames):  # no engine connected (IMMEDIATE), or its pipe is full
            raise EngineUnavailable("the engine process is not reachable; retry later")

    # -- answers -----------------------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            message = await self.socket.recv_multipart(copy=False)
            try:
                self._answer(*message)
            except Exception:  # one bad message: logged; its request is answered by its timer
                log.exception("an answer from the engine could not be read")

    def _answer(self, kind, header, *frames) -> None:
        kind = kind.bytes
        if kind == b"r":
            found = _result.decode(header.buffer)
            self._settle(found.id, "set_result", (found, frames))
        elif kind == b"e":
            found = _error.decode(header.buffer)
            error = _ERRORS.get(found.kind, ModelFailed)(found.message)
            error.device = found.device
            self._settle(found.id, "set_exception", error)
        else:  # an answer to a query: its id first
            raw = header.bytes
            self._settle(msgspec.msgpack.decode(raw)[0], "set_result", (raw, None))

    def _settle(self, ident: int, setter: str, value) -> None:
        future = self.pending.get(ident)
        if future is not None and not future.done():
            getattr(future, setter)(value)

    def _expire(self, ident: int) -> None:
        self._settle(ident, "set_exception", Timeout("no answer from the engine within the request timeout"))

    def _fail_all(self, error: ServiceError) -> None:
        for future in list(self.pending.values()):
            if not future.done():
                future.set_exception(type(error)(str(error)))

    async def _watch(self, monitor) -> None:
        """Follow the connection: when the engine process goes, every request waiting on it is answered."""
        while True:
            try:
                event = (await recv_monitor_message(monitor))["event"]
            except Exception:  # a monitor message not as expected: logged, and the watch goes on
                log.exception("the link's monitor sent a message that could not be read")
                continue
            if event == zmq.EVENT_DISCONNECTED:
                self.connection += 1  # a catalog fetch for the connection before is stale
                self._set_up(False)
                log.error("the engine process went away: answering its %d requests in flight with 503",
                          len(self.pending))
                self._fail_all(EngineUnavailable("the engine process stopped while serving this request; "
                                                 "retry later"))
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED and self.catalog is not None and not self.up:
                self.connection += 1
                self._tasks.append(asyncio.create_task(self._reconnected(self.connection)))

    async def _reconnected(self, connection: int) -> None:
        """The engine is back (a new process): its catalog, then requests again; until this connection
        drops."""
        while connection == self.connection:
            try:
                catalog = await self._fetch_catalog(timeout=5.0)
            except Timeout:
                continue  # still loading its models
            except ServiceError:
                await asyncio.sleep(0.1)  # not there for a moment
                continue
            if connection == self.connection:
                self.catalog = catalog
                self._set_up(True)
                log.info("the engine process is back")
            return

    def _set_up(self, up: bool) -> None:
        self.up = up
        if self.on_change is not None:
            self.on_change(up)


class EngineServer:
    """The engine's side: takes requests from every front end and answers each once."""

    def __init__(self, service, endpoint: str) -> None:
        self.service, self.endpoint = service, endpoint
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a front end gone: its answers are dropped
        self.catalog = msgspec.to_builtins(service.catalog())

    def bind(self) -> None:
        self.socket.bind(self.endpoint)

    async def serve(self) -> None:
        while True:
            peer, kind, *rest = await self.socket.recv_multipart(copy=False)
            try:
                kind = kind.bytes
                if kind == b"R":
                    asyncio.ensure_future(self._run(peer, *rest))
                elif kind in (b"S", b"T", b"C"):
                    self._query(peer, kind, _query.decode(rest[0].buffer))
                else:
                    log.error("engine: a message of unknown kind %r from a front end", kind[:8])
            except Exception:  # one bad message: logged, and the link serves on
                log.exception("engine: a message from a front end could not be read")

    def close(self) -> None:
        self.context.destroy(linger=0)

    async def _run(self, peer, header, *frames) -> None:
        request = _run.decode(header.buffer)  # a front end's message: it decodes, or the serve loop logs it
        try:
            result = await self.service.run(request.work, arrays_in(request.tensors, frames))
            tensors, buffers = arrays_out(result.outputs)
            reply = [b"r", _encode(ResultHeader(request.id, result.model, result.version, result.datatypes,
                                                result.device, result.worker, result.batch_size, result.batched,
                                                result.timings, tensors)), *buffers]
        except ServiceError as exc:
            reply = [b"e", _encode(ErrorHeader(request.id, type(exc).__name__, str(exc),
                                               getattr(exc, "device", "none")))]
        except Exception as exc:  # a bug of ours: the request is still answered
            log.exception("engine: request %d failed", request.id)
            reply = [b"e", _encode(ErrorHeader(request.id, "ModelFailed",
                                               f"internal error ({type(exc).__name__}); see the engine's log", "none"))]
        if not send_now(self.socket, [peer, *reply]):
            log.error("engine: the answer to request %d could not be sent (its front end is gone or full)",
                      request.id)

    def _query(self, peer, kind: bytes, query: Query) -> None:
        if kind == b"C":
            reply = [b"c", _encode(Answer(query.id, self.catalog))]
        elif kind == b"S":
            reply = [b"s", _encode(Answer(query.id, self.service.status()))]
        else:
            reply = [b"t", _encode(Answer(query.id, self.service.statistics(query.model, query.version)))]
        send_now(self.socket, [peer, *reply])
