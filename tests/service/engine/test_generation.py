"""The engine at its own level: an ``Engine`` run in this process by ``running`` (its workers threads
here, on a sim device), on an event loop of its own thread, with requests handed to ``Engine.submit``
as the gateway hands them. No server, no client: what model control does to generations is seen
directly.

* admission: a request is counted in the generation served when it came in, until it is answered;
* a load swaps generations under concurrent requests: each is answered, by the version of its own
  generation, and the old generation retires only once its count is zero;
* a model's call made under a retired generation still runs the model that generation served (the
  negative control: the same call under the new generation finds no such model), as does a request
  from a catalog one change behind, until the old generation has retired;
* the count reaching zero is what a retirement waits for (a held request keeps it above zero).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import socket
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import paddle
import pytest
from support import wait_until

import placeenv.sim
from support.servers import TEST_REPOSITORY

from placeenv.serve.config import Settings
from placeenv.serve.engine import control
from placeenv.serve.engine.engine import running
from placeenv.serve.models.repository import BUNDLED
from placeenv.serve.protocol.errors import ModelFailed, UnknownModel
from placeenv.serve.protocol.request import Work

#: How long a test waits for anything: long enough on a machine 4x slower, never a fixed pause.
WAIT_S = 30

#: Holds its worker until the test releases it (connecting to the test's port, its config's ``hold``),
#: then calls ``affine`` (``Model.infer``): a call made after whatever the test did meanwhile. A zero
#: input (the warm-up's) neither holds nor calls.
HOLD_THEN_CALL = '''
import socket

from placeenv.serve.models import Model as Base, TensorSpec


class Model(Base):
    inputs = [TensorSpec("x", "FP32", (-1, 4))]
    outputs = [TensorSpec("y", "FP32", (-1, 4))]

    def load(self, context):
        return None

    def execute(self, inputs):
        x = inputs["x"]
        if float(x.abs().sum()) == 0.0:
            return {"y": x}
        with socket.create_connection(("127.0.0.1", int(self.context.parameters["hold"])), timeout=120) as held:
            held.recv(1)  # the test's release: its end of the connection closing
        return {"y": self.infer("affine", {"x": x})["y"]}
'''

X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3


class InProcess:
    """An engine started by ``running`` on an event loop of its own thread; ``submit`` hands it a request
    from the test's thread and gives back a future of its answer."""

    def __init__(self, settings: Settings) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True)
        self.thread.start()
        self.running = running(settings)
        self.engine = self.wait(self.running.__aenter__())

    def wait(self, coroutine, timeout: float = WAIT_S):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def later(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def on_loop(self, function):
        """``function()`` on the loop thread (where the engine's tables are read and written), its value."""
        async def call():
            return function()
        return self.wait(call())

    def submit(self, model: str, x: np.ndarray, version: int = 1, output: str = "y") -> concurrent.futures.Future:
        answer: concurrent.futures.Future = concurrent.futures.Future()

        def done(result, error) -> None:
            if error is None:
                answer.set_result(result)
            else:
                answer.set_exception(error)

        def go() -> None:
            now = time.perf_counter()
            work = Work(model, version, x.shape[0], [output], now, now + WAIT_S, True)
            self.engine.submit(work, {"x": x}, done)

        self.loop.call_soon_threadsafe(go)
        return answer

    def admitted(self) -> int:
        return self.on_loop(lambda: self.engine.served.generation.admitted)

    def close(self) -> None:
        try:
            self.wait(self.running.__aexit__(None, None, None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT_S)
            self.loop.close()


@pytest.fixture(scope="module")
def gate():
    """Where ``hold_call``'s requests connect: each connection accepted is a request held on its worker."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(WAIT_S)
        yield server


@pytest.fixture(scope="module")
def repository(tmp_path_factory, gate) -> Path:
    root = tmp_path_factory.mktemp("generations")
    shutil.copytree(Path(TEST_REPOSITORY) / "affine", root / "affine", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "hold_call" / "1").mkdir(parents=True)
    (root / "hold_call" / "1" / "model.py").write_text(HOLD_THEN_CALL)
    (root / "hold_call" / "config.yaml").write_text(f"max_batch_size: 0\nparameters:\n  hold: {gate.getsockname()[1]}\n")
    return root


@pytest.fixture(scope="module")
def engine(repository):
    found = InProcess(Settings(devices="sim:0", workers_per_device=2, model_repository=str(repository),
                               models="affine,hold_call", model_control_mode="explicit", shutdown_grace_s=WAIT_S))
    try:
        yield found
    finally:
        found.close()


def new_version(repository: Path, number: int) -> None:
    shutil.copytree(repository / "affine" / "1", repository / "affine" / str(number),
                    ignore=shutil.ignore_patterns("__pycache__"))


def test_a_request_is_counted_in_its_generation_until_it_is_answered(engine, gate):
    """Admission: the held request is counted (the negative control of zero), and let go of once answered;
    one the engine does not serve is refused and counted for no longer than its refusal."""
    assert engine.admitted() == 0
    held = engine.submit("hold_call", X)
    connection, _ = gate.accept()  # on its worker now
    with connection:
        assert engine.admitted() >= 1
        with pytest.raises(UnknownModel):
            engine.submit("no_such_model", X).result(WAIT_S)
        assert engine.admitted() >= 1 and not held.done()
    assert np.allclose(held.result(WAIT_S).outputs["y"], X * 2 + 1)
    assert engine.admitted() == 0


def test_a_load_swaps_generations_under_concurrent_requests(engine, repository):
    """Requests keep coming while a load of affine's version 2 retires version 1: each is answered, by the
    version of the generation it came in under; the old generation retires with its count at zero, and
    its version leaves the queues and the workers."""
    before = engine.on_loop(lambda: engine.engine.served.generation)
    old = list(before.versions[("affine", 1)].replicas.items())
    new_version(repository, 2)
    try:
        load = engine.later(engine.engine.load("affine"))
        answers = []
        while not load.done():  # concurrent with the whole load: staging, swap and retirement
            answers += [engine.submit("affine", X, version=v) for v in (1, 2)]
            concurrent.futures.wait(answers[-2:], WAIT_S)
        load.result(WAIT_S)
        answers += [engine.submit("affine", X, version=v) for v in (1, 2)]  # (at least one after the swap)
    finally:
        shutil.rmtree(repository / "affine" / "2")
    after = engine.on_loop(lambda: engine.engine.served.generation)
    assert after is not before and before.admitted == 0
    assert set(before.versions) == {("affine", 1), ("hold_call", 1)}
    assert set(after.versions) == {("affine", 2), ("hold_call", 1)}
    served = [a.result(WAIT_S).version for a in answers if a.exception(WAIT_S) is None]
    refused = [a.exception(WAIT_S) for a in answers if a.exception(WAIT_S) is not None]
    # Version 1 answered until the swap and version 2 from it; each refusal is a version its generation
    # did not serve (2 before the swap, 1 after): no request failed for the swap itself.
    assert set(served) == {1, 2}, served
    assert all(isinstance(e, UnknownModel) for e in refused), refused
    # Version 1's replicas, which only the old generation served, finalized and let go of once it retired;
    # version 2's on the same workers.
    assert old and all(replica.network is None for _, replica in old)
    assert not before.versions[("affine", 1)].replicas.items()
    assert after.versions[("affine", 2)].replicas.names() == tuple(name for name, _ in old)
    engine.wait(engine.engine.load("affine"))  # the repository as it was: version 1 again
    assert np.allclose(engine.submit("affine", X).result(WAIT_S).outputs["y"], X * 2 + 1)


def test_a_call_under_a_retired_generation_runs_what_that_generation_served(engine, gate):
    """A request held on its worker while affine is unloaded: the catalog loses affine at once, the
    unload waits (the old generation's count is not zero), and the request's call to affine, made after
    the swap, runs on the generation it was admitted under. Then the same call under the new generation
    finds no affine (the negative control), and affine's version is gone from every worker."""
    held = engine.submit("hold_call", X)
    connection, _ = gate.accept()
    with connection:
        old = engine.on_loop(lambda: engine.engine.served.generation)
        replicas = list(old.versions[("affine", 1)].replicas.items())
        unload = engine.later(engine.engine.unload("affine"))
        wait_until(lambda: "affine" not in engine.on_loop(lambda: engine.engine.catalog().models), WAIT_S,
                   "the catalog still has affine")
        assert not unload.done() and old.admitted >= 1  # draining the held request
        # A request naming affine from a catalog one change behind (a front end's, until the change
        # reaches it): admitted under the retiring generation, which serves it.
        assert np.allclose(engine.submit("affine", X).result(WAIT_S).outputs["y"], X * 2 + 1)
    answer = held.result(WAIT_S)  # its call ran after the swap
    assert np.allclose(answer.outputs["y"], X * 2 + 1)
    unload.result(WAIT_S)
    assert old.admitted == 0
    with pytest.raises(UnknownModel):  # retired: nothing serves it now
        engine.submit("affine", X).result(WAIT_S)
    assert replicas and all(replica.network is None for _, replica in replicas)  # finalized on their workers
    assert not old.versions[("affine", 1)].replicas.items()  # and let go of
    refused = engine.submit("hold_call", X)
    connection, _ = gate.accept()
    connection.close()
    with pytest.raises(ModelFailed, match="affine"):
        refused.result(WAIT_S)
    engine.wait(engine.engine.load("affine"))
    assert np.allclose(engine.submit("affine", X).result(WAIT_S).outputs["y"], X * 2 + 1)


def test_the_count_reaching_zero_is_what_a_retirement_waits_for(engine, gate):
    """``Generation.drained``: False while a request is held (the count above zero), True at once after."""
    held = engine.submit("hold_call", X)
    connection, _ = gate.accept()
    generation = engine.on_loop(lambda: engine.engine.served.generation)
    with connection:
        assert engine.wait(generation.drained(0.05)) is False
        assert generation.admitted >= 1
    held.result(WAIT_S)
    assert engine.wait(generation.drained(WAIT_S)) is True and generation.admitted == 0


def _held(frame) -> bool:
    """Whether a thread whose innermost frame is ``frame`` waits in the control's ``hold`` (between batches)."""
    while frame is not None:
        if frame.f_code.co_name == "hold" and frame.f_code.co_filename == control.__file__:
            return True
        frame = frame.f_back
    return False


def test_the_devices_cache_is_emptied_with_every_worker_between_two_batches(engine, repository, gate, monkeypatch):
    """Paddle's empty_cache releases every device's cached blocks, and a worker allocating meanwhile crashed
    the process (CI: a segfault in the swap under load above). An unload empties the cache with each worker
    held between two batches. The control: emptied at once, as before, while a request holds its worker in
    a batch, that worker is seen outside ``hold``."""
    threads = engine.on_loop(lambda: [w.thread for w in engine.engine.pool.workers])
    seen: list[list[bool]] = []
    real = paddle.device.empty_cache

    def spy() -> None:
        frames = sys._current_frames()
        seen.append([_held(frames.get(thread.ident)) for thread in threads])
        real()

    monkeypatch.setattr(paddle.device, "empty_cache", spy)
    held = engine.submit("hold_call", X)
    connection, _ = gate.accept()  # on its worker now, in its batch
    with connection:
        paddle.device.empty_cache()  # at once, as an unload emptied it before
    assert np.allclose(held.result(WAIT_S).outputs["y"], X * 2 + 1)
    assert len(seen) == 1 and not all(seen[0]), seen

    seen.clear()
    new_version(repository, 2)
    try:
        load = engine.later(engine.engine.load("affine"))
        answers = []
        while not load.done():  # requests all along: workers in their batches when the unload comes
            answers += [engine.submit("affine", X, version=v) for v in (1, 2)]
            concurrent.futures.wait(answers[-2:], WAIT_S)
        load.result(WAIT_S)
    finally:
        shutil.rmtree(repository / "affine" / "2")
    concurrent.futures.wait(answers, WAIT_S)
    assert seen and all(all(held) for held in seen), seen
    engine.wait(engine.engine.load("affine"))  # the repository as it was: version 1 again


def test_a_stopped_engine_finalizes_every_replica_on_its_worker(repository):
    """Each worker, as its thread ends, finalizes the replicas its slot holds in the generation served (the
    generation holds them; the worker keeps no list of its own): every replica of every version, on both
    workers. (Holding's own test has the control: a slot that names no version finalizes nothing.)"""
    found = InProcess(Settings(devices="sim:0", workers_per_device=2, model_repository=str(repository),
                               models="affine", shutdown_grace_s=WAIT_S))
    try:
        assert np.allclose(found.submit("affine", X).result(WAIT_S).outputs["y"], X * 2 + 1)
        generation = found.on_loop(lambda: found.engine.served.generation)
    finally:
        found.close()
    replicas = list(generation.versions[("affine", 1)].replicas.items())
    assert [name for name, _ in replicas] == ["sim:0/0", "sim:0/1"]
    assert all(replica.network is None for _, replica in replicas), replicas


def test_an_unload_lets_go_of_the_replicas_loaded_at_start_and_their_memory(tmp_path):
    """A model loaded at the service's start, unloaded: its replicas are freed (the generation held them
    alone: the workers' start reports, which carried them to it, let go of them) and each device's memory
    goes back. (Without the reports let go of, the replicas lived on and no byte went back.)"""
    for name in ("digits", "spare"):
        shutil.copytree(BUNDLED / "digits", tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    found = InProcess(Settings(devices="sim:0,sim:1", workers_per_device=2, model_repository=str(tmp_path),
                               models="digits,spare", model_control_mode="explicit", shutdown_grace_s=WAIT_S))
    try:
        held = found.on_loop(lambda: [weakref.ref(replica) for _, replica in
                                      found.engine.served.generation.versions[("spare", 1)].replicas.items()])
        used = [placeenv.sim.stats(i).memory_used for i in (0, 1)]
        found.wait(found.engine.unload("spare"))
        assert len(held) == 4 and all(ref() is None for ref in held)
        after = [placeenv.sim.stats(i).memory_used for i in (0, 1)]
        assert all(a < u for a, u in zip(after, used)), (used, after)
    finally:
        found.close()
