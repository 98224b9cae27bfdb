"""The engine's side of the link (link.py has the protocol): one ROUTER socket that takes requests from
every front end, answers each once, and hands each front end every new catalog."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import msgspec
import zmq

from ..protocol.errors import Cancelled, ServiceError, internal_error
from .link import (PUBLISH_S, Pump, Query, Reply, ResultHeader, arrays_in, arrays_out, decode_query, decode_run,
                   encode, error_frames, send_now)

log = logging.getLogger(__name__)


class EngineServer:
    """The engine's side: takes requests from every front end and answers each once."""

    def __init__(self, engine, endpoint: str) -> None:
        self.engine, self.endpoint = engine, endpoint
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a front end gone: its answers are dropped
        self.catalog = msgspec.to_builtins(engine.catalog())
        self.pump: Pump | None = None
        # Each request not yet answered, by (front end, its id): its handle, for a cancel (b"X").
        self.handles: dict[tuple[bytes, int], Any] = {}
        self.peers: set[bytes] = set()  # the front ends that asked for the catalog: each gets its changes
        self.publishing: dict[int, tuple[asyncio.Future, set[bytes]]] = {}  # a change -> who has yet to ack
        self.changes = itertools.count(1)
        self.controls: set[asyncio.Task] = set()
        engine.publishers.append(self.publish)

    async def publish(self, catalog) -> None:
        """Hand a new catalog to every front end, and wait until each has it (or ``PUBLISH_S`` passes)."""
        self.catalog = msgspec.to_builtins(catalog)
        if not self.peers:
            return
        change = next(self.changes)
        future = asyncio.get_running_loop().create_future()
        waiting = set(self.peers)
        self.publishing[change] = (future, waiting)
        header = encode(Reply(change, self.catalog))
        # Mandatory for these sends only: a front end that is gone (restarted under a new identity) is
        # told apart from one that is slow, and left out; answers to a gone front end are still dropped.
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            for peer in list(waiting):
                try:
                    sent = self._send([peer, b"u", header])
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    self.peers.discard(peer)
                    sent = False
                if not sent:
                    waiting.discard(peer)
        finally:
            self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        try:
            if waiting:
                await asyncio.wait_for(future, PUBLISH_S)
        except asyncio.TimeoutError:
            # Still connected, so still sent every later change (each holds the whole catalog).
            log.error("engine: %d front end(s) did not acknowledge the new catalog within %g s; answering "
                      "without them", len(waiting), PUBLISH_S)
        finally:
            del self.publishing[change]

    def _acknowledged(self, peer: bytes, change: int) -> None:
        found = self.publishing.get(change)
        if found is None:
            return
        future, waiting = found
        waiting.discard(peer)
        if not waiting and not future.done():
            future.set_result(None)

    def bind(self) -> None:
        self.socket.bind(self.endpoint)

    async def serve(self) -> None:
        """Answer the front ends until cancelled (after ``bind``)."""
        self.pump = Pump(self.socket, self._on_message)
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self.pump.close()

    def close(self) -> None:
        self.context.destroy(linger=0)

    def _on_message(self, message: list[zmq.Frame]) -> None:
        peer, kind, header, *frames = message
        kind = kind.bytes
        if kind == b"R":
            self._submit(peer, header, frames)
        elif kind == b"X":
            handle = self.handles.get((peer.bytes, decode_query(header.buffer).id))
            if handle is not None:  # (None: answered already, or answered as it was submitted)
                handle.cancel()
        elif kind in (b"S", b"T", b"C"):
            self._query(peer, kind, decode_query(header.buffer))
        elif kind == b"U":
            self._acknowledged(peer.bytes, decode_query(header.buffer).id)
        elif kind in (b"L", b"D"):
            task = asyncio.ensure_future(self._control(peer, kind, decode_query(header.buffer)))
            self.controls.add(task)
            task.add_done_callback(self.controls.discard)
        else:
            log.error("engine: a message of unknown kind %r from a front end", kind[:8])

    def _submit(self, peer, header, frames) -> None:
        request = decode_run(header.buffer)
        key, handles = (peer.bytes, request.id), self.handles
        handles[key] = None  # (the engine may answer it before submit returns: then it is gone)
        # A callback, not a task per request: the engine calls it once, with the result or the error.
        handle = self.engine.submit(request.work, arrays_in(request.tensors, frames),
                                    lambda result, error: self._reply(peer, key, result, error))
        if key in handles:
            handles[key] = handle

    def _reply(self, peer, key: tuple[bytes, int], result, error) -> None:
        self.handles.pop(key, None)
        if type(error) is Cancelled:  # its front end cancelled it, and answered its client's leaving
            return
        ident, reply = key[1], None
        if error is None:
            try:
                tensors, buffers = arrays_out(result.outputs)
                reply = [b"r", encode(ResultHeader(ident, result.model, result.version, result.datatypes,
                                                    result.device, result.worker, result.batch_size,
                                                    result.batched, result.timings, tensors)), *buffers]
            except Exception as exc:  # a result that cannot cross: the request is still answered
                error = exc
        if reply is None and not isinstance(error, ServiceError):  # a bug of ours: the request is still answered
            log.error("engine: request %d failed", ident, exc_info=error)
            error = internal_error(error, "the engine's log")
        if reply is None:
            reply = error_frames(ident, error, error.device)
        if not self._send([peer, *reply]):
            log.error("engine: the answer to request %d could not be sent (its front end is gone or full)", ident)

    def _send(self, frames: list) -> bool:
        sent = send_now(self.socket, frames)
        if self.pump is not None:
            self.pump.sent()
        return sent

    async def _control(self, peer, kind: bytes, query: Query) -> None:
        """A front end's load or unload: answered once done, every front end having the new catalog."""
        try:
            if kind == b"L":
                await self.engine.load(query.model)
            else:
                await self.engine.unload(query.model, query.dependents)
            reply = [b"l", encode(Reply(query.id, None))]
        except ServiceError as error:
            reply = error_frames(query.id, error)
        except Exception as error:  # a bug of ours: still answered
            log.exception("engine: a model control request failed")
            reply = error_frames(query.id, internal_error(error, "the engine's log"))
        self._send([peer, *reply])

    def _query(self, peer, kind: bytes, query: Query) -> None:
        if kind == b"C":
            self.peers.add(peer.bytes)
            reply = [b"c", encode(Reply(query.id, self.catalog))]
        elif kind == b"S":
            reply = [b"s", encode(Reply(query.id, self.engine.status()))]
        else:
            reply = [b"t", encode(Reply(query.id, self.engine.statistics(query.model, query.version)))]
        self._send([peer, *reply])
