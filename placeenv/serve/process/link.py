"""The link between front ends and the engine: ZeroMQ over ipc, msgpack headers, arrays as raw frames.

Each front end holds one DEALER socket (``EngineClient``); the engine one ROUTER
(``EngineServer``). A message is a kind frame, a msgpack header (msgspec) and, for
requests and results, one frame per array: its buffer as it lies in memory, never
pickled, received without a copy (``np.frombuffer`` over ZeroMQ's frame).

    front end -> engine   b"R" run (id, Work, tensors) + arrays | b"X" cancel (id) | b"S" status |
                          b"T" statistics | b"C" catalog | b"L" load / b"D" unload a model | b"U" a new catalog received
    engine -> front end   b"r" result + arrays | b"e" error | b"s" / b"t" / b"c" / b"l" the answers
                          | b"u" a new catalog (a load or an unload), which the front end acknowledges

A load or an unload is answered once every connected front end has acknowledged the catalog it
made (or ``PUBLISH_S`` passed, said in the log): what a front end sent before its acknowledgement has
reached the engine by then (one connection keeps its order), so no request checked against the old
catalog arrives after the engine stops serving what it retired.

Every request a front end sends is answered exactly once: by the engine (a request whose
client left is cancelled, ``b"X"``: the engine withdraws its job and sends nothing back), or, when
the engine process goes away (ZeroMQ's monitor sees the ipc connection drop) or
stays silent past the request's deadline, by the front end itself.

Both sides use plain (blocking-API) ZeroMQ sockets, read by a ``Pump`` on the event loop: one
reader callback on the socket's file descriptor takes every message that is there before it
returns, and sends never wait (NOBLOCK). zmq.asyncio's future, callbacks and reader
re-registration per message cost more than the hop itself, and reading everything that arrived
before yielding hands the engine's workers each burst whole, to batch.
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
from zmq.utils.monitor import parse_monitor_message

from ..protocol import errors, wire
from ..protocol.errors import EngineUnavailable, ModelFailed, Overloaded, ServiceError, Timeout
from ..protocol.request import Catalog, Result, Work

log = logging.getLogger(__name__)

#: (name, numpy dtype string, shape) of each array frame.
Tensors = list[tuple[str, str, tuple[int, ...]]]
#: The dtype string of a BYTES array's frame: its elements serialized (``wire.bytes_to_binary``).
BYTES = "BYTES"


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
    dependents: bool = False  # an unload's unload_dependents


class Reply(msgspec.Struct, array_like=True):
    """The engine's reply to a ``Query``."""

    id: int
    value: Any


encode = msgspec.msgpack.Encoder().encode
decode_run = msgspec.msgpack.Decoder(RunHeader).decode
_decode_result = msgspec.msgpack.Decoder(ResultHeader).decode
_decode_error = msgspec.msgpack.Decoder(ErrorHeader).decode
decode_query = msgspec.msgpack.Decoder(Query).decode
_decode_reply = msgspec.msgpack.Decoder(Reply).decode


def error_frames(ident: int, error: ServiceError, device: str = "none") -> list:
    """The engine's answer ``error`` to request or query ``ident``, as frames."""
    return [b"e", encode(ErrorHeader(ident, type(error).__name__, str(error), device))]

#: How long the engine waits for the front ends to acknowledge a new catalog (a front end that is gone
#: is left out at once; a new one asks for the catalog when it connects).
PUBLISH_S = 5.0
#: How long a front end waits for a load or an unload (building every worker's replica, warm-up included).
CONTROL_S = 600.0

#: How often a front end looks for requests the engine left past their deadline (a backstop for an
#: engine that cannot answer: it answers 504 itself at the deadline, ``GRACE_S`` before this).
SWEEP_S = 0.25
GRACE_S = 1.0

#: The errors an engine may answer with, by name: each crosses as its class and message (those made
#: of a message alone; any other crosses as ModelFailed, its message kept).
_ERRORS = {cls.__name__: cls for cls in errors.OUTCOMES
           if cls.__init__ is errors.ServiceError.__init__}


def arrays_out(arrays) -> tuple[Tensors, list[np.ndarray]]:
    """Each array's description and its contiguous buffer, to send as frames (a BYTES array, whose
    memory is pointers, as its serialized elements)."""
    tensors, buffers = [], []
    for name, array in arrays.items():
        if array.dtype == object:
            tensors.append((name, BYTES, array.shape))
            buffers.append(wire.bytes_to_binary(array))
            continue
        array = np.require(array, requirements="C")  # not ascontiguousarray: it makes a 0-d array 1-d
        tensors.append((name, array.dtype.str, array.shape))
        buffers.append(array)
    return tensors, buffers


def arrays_in(tensors: Tensors, frames) -> dict[str, np.ndarray]:
    """The arrays over the received frames' memory (read-only, no copy)."""
    found = {}
    for (name, dtype, shape), frame in zip(tensors, frames):
        buffer = frame.buffer if isinstance(frame, zmq.Frame) else frame
        found[name] = (wire.bytes_from_binary(buffer, name, tuple(shape)) if dtype == BYTES
                       else np.frombuffer(buffer, dtype).reshape(shape))
    return found


#: A pump hands the loop back after this many messages in one go, so a flood of requests cannot
#: keep the loop from answering (it reads on at the loop's next turn).
PUMP_BATCH = 512


class Pump:
    """Reads a ZeroMQ socket from the event loop: every message there, one callback.

    ZeroMQ's file descriptor is edge-triggered: it becomes readable when the socket's state
    changes, and any call on the socket (a send included) may consume that edge while a message
    waits. So a read goes on until ZeroMQ says Again, and ``sent`` looks again after a send
    made outside a read.
    """

    def __init__(self, socket: zmq.Socket, handle, copy: bool = False) -> None:
        self.socket, self.handle, self.copy = socket, handle, copy
        self.loop = asyncio.get_running_loop()
        self.fd = socket.getsockopt(zmq.FD)
        self.reading = False  # in ``read``: its own loop sees what a send there let in
        self.scheduled = False
        self.loop.add_reader(self.fd, self.read)
        self._again()  # what came before the reader: the descriptor's edge for it may be gone

    def read(self) -> None:
        self.scheduled = False
        self.reading = True
        recv, handle, copy = self.socket.recv_multipart, self.handle, self.copy
        try:
            for _ in range(PUMP_BATCH):
                try:
                    frames = recv(zmq.NOBLOCK, copy=copy)
                except zmq.Again:
                    return
                try:
                    handle(frames)
                except Exception:  # one message that cannot be read: logged, and the pump reads on
                    log.exception("a message on the link could not be read")
            self._again()
        except zmq.ZMQError as exc:
            if exc.errno != zmq.ENOTSOCK:  # the socket closed while reading (shutdown)
                raise
        finally:
            self.reading = False

    def sent(self) -> None:
        """After a send outside ``read``: a message that arrived meanwhile is read at the next turn."""
        if not self.reading and not self.scheduled and self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._again()

    def _again(self) -> None:
        self.scheduled = True
        self.loop.call_soon(self.read)

    def close(self) -> None:
        self.loop.remove_reader(self.fd)


def send_now(socket: zmq.Socket, frames: list) -> bool:
    """Send ``frames`` without waiting; False when they cannot go now."""
    try:
        socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return False
    return True


def endpoint(run_dir: str) -> str:
    return f"ipc://{run_dir}/engine.sock"


class EngineClient:
    """A front end's side of the link: ``run`` a checked request on the engine, ask its status."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        # Nothing queues for an engine that is not there: a send then fails at once, and is answered.
        self.socket.setsockopt(zmq.IMMEDIATE, 1)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.pending: dict[int, asyncio.Future] = {}
        # Each request's last moment (perf_counter), past which the front end answers it itself.
        self.deadlines: dict[int, float] = {}
        self.ids = itertools.count(1)
        self.catalog: Catalog | None = None
        self.up = False
        self.connection = 0  # counts the engine connection's changes
        self.on_change = None  # called with True / False when the engine comes / goes
        self._tasks: list[asyncio.Task] = []
        self._pumps: list[Pump] = []

    async def connect(self) -> None:
        """Connect, and wait for the engine's catalog (the engine answers once its workers are up)."""
        monitor = self.socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.socket.connect(self.endpoint)
        self.pump = Pump(self.socket, self._on_message)
        self._pumps = [self.pump, Pump(monitor, self._watch, copy=True)]
        self._tasks = [asyncio.create_task(self._sweep())]
        while self.catalog is None:
            try:
                self.catalog = await self._fetch_catalog(timeout=1.0)
            except EngineUnavailable:
                await asyncio.sleep(0.05)  # the engine is still starting: its socket is not bound yet
            except Timeout:
                continue  # bound, still loading its models
        self.up = True

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for pump in self._pumps:
            pump.close()
        self._fail_all(EngineUnavailable("the front end is shutting down"))
        self.context.destroy(linger=0)  # every socket of ours: the link's and its monitor

    # -- requests ----------------------------------------------------------------------------

    async def run(self, work: Work, arrays: dict[str, np.ndarray]) -> Result:
        # The engine decides overload, draining and the deadline (engine/dispatch.py); the link answers
        # only for an engine that is not there, that holds all it can (its catalog's capacity) and
        # answers nothing (stalled), or that cannot answer by the deadline.
        if not self.up:
            raise EngineUnavailable("the engine process is restarting; retry later")
        if self.catalog.capacity is not None and len(self.pending) >= self.catalog.capacity:
            raise Overloaded("too many requests wait on the engine; retry later")
        tensors, buffers = arrays_out(arrays)
        ident = next(self.ids)
        future = self.pending[ident] = asyncio.get_running_loop().create_future()
        self.deadlines[ident] = work.deadline + GRACE_S
        try:
            self._send([b"R", encode(RunHeader(ident, work, tensors)), *buffers])
            header, frames = await future
        except asyncio.CancelledError:  # the client left: the engine withdraws its job
            send_now(self.socket, [b"X", encode(Query(ident))])
            self.pump.sent()
            raise
        finally:
            del self.pending[ident], self.deadlines[ident]
        return Result(header.model, header.version, arrays_in(header.tensors, frames), header.datatypes,
                      header.device, header.worker, header.batch_size, header.batched, header.timings)

    async def status(self) -> dict[str, Any]:
        if not self.up:
            return {"ready": False, "stopping": False, "engine": "restarting"}
        try:
            return _decode_reply(await self._ask(b"S", None, timeout=2.0)).value
        except ServiceError as exc:  # an engine that does not answer in time is not ready
            return {"ready": False, "stopping": False, "engine": str(exc)}

    async def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]:
        return _decode_reply(await self._ask(b"T", (model, version), timeout=5.0)).value

    async def load(self, name: str) -> None:
        await self._ask(b"L", (name, None), timeout=CONTROL_S)

    async def unload(self, name: str, dependents: bool = False) -> None:
        await self._ask(b"D", (name, None), timeout=CONTROL_S, dependents=dependents)

    async def _fetch_catalog(self, timeout: float) -> Catalog:
        return msgspec.convert(_decode_reply(await self._ask(b"C", None, timeout)).value, Catalog)

    async def _ask(self, kind: bytes, query, timeout: float, dependents: bool = False) -> bytes:
        ident = next(self.ids)
        future = self.pending[ident] = asyncio.get_running_loop().create_future()
        model, version = query or (None, None)
        try:
            self._send([kind, encode(Query(ident, model, version, dependents))])
            header, _ = await asyncio.wait_for(future, timeout)
            return header
        except asyncio.TimeoutError:
            raise Timeout(f"the engine did not answer within {timeout:g} s") from None
        finally:
            self.pending.pop(ident, None)

    def _send(self, frames: list) -> None:
        sent = send_now(self.socket, frames)
        self.pump.sent()
        if not sent:  # no engine connected (IMMEDIATE), or its pipe is full
            raise EngineUnavailable("the engine process is not reachable; retry later")

    # -- answers -----------------------------------------------------------------------------

    def _on_message(self, message: list[zmq.Frame]) -> None:
        kind, header, *frames = message
        kind = kind.bytes
        if kind == b"r":
            found = _decode_result(header.buffer)
            self._settle(found.id, "set_result", (found, frames))
        elif kind == b"e":
            found = _decode_error(header.buffer)
            error = _ERRORS.get(found.kind, ModelFailed)(found.message)
            error.device = found.device
            self._settle(found.id, "set_exception", error)
        elif kind == b"u":  # the engine's catalog changed: from now on, requests are checked against this
            found = _decode_reply(header.buffer)
            self.catalog = msgspec.convert(found.value, Catalog)
            send_now(self.socket, [b"U", encode(Query(found.id))])
            self.pump.sent()
        else:  # a reply to a query: its id first
            raw = header.bytes
            self._settle(msgspec.msgpack.decode(raw)[0], "set_result", (raw, None))

    def _settle(self, ident: int, setter: str, value) -> None:
        future = self.pending.get(ident)
        if future is not None and not future.done():
            getattr(future, setter)(value)

    async def _sweep(self) -> None:
        """Answer requests the engine left past their deadline: one pass a while, not a timer per request."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.perf_counter()
            for ident in [i for i, deadline in self.deadlines.items() if deadline <= now]:
                self._settle(ident, "set_exception", Timeout("no answer from the engine within the request timeout"))

    def _fail_all(self, error: ServiceError) -> None:
        for future in list(self.pending.values()):
            if not future.done():
                future.set_exception(type(error)(str(error)))

    def _watch(self, message: list[bytes]) -> None:
        """Follow the connection: when the engine process goes, every request waiting on it is answered."""
        event = parse_monitor_message(message)["event"]
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
