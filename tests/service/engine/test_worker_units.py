"""The units a worker calls, each run here without a worker's thread:

* the failure policy (``batch.run_batch``): a job past its deadline is answered 504 and not run, a failed
  batch runs again request by request so that one bad request fails alone;
* the model calls (``calls.Calls``): the context a batch's model code reads, set by a token pair and left
  as it was after; a call from a thread the engine did not start refused clearly, even with the context
  copied, where the worker's own thread's call goes through (the control); a worker waiting for a call
  serves its queue's other models, never those in hand;
* the replicas (``replica.stage``, ``Holding``): built on the calling thread, a replacement's refilling its
  slot in the version that names it, each finalized once let go of.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from support.servers import TEST_REPOSITORY

import placeenv
from placeenv.serve.engine.batch import PlaceChecker, run_batch
from placeenv.serve.engine.calls import Calls
from placeenv.serve.engine.dispatch import DeviceQueue
from placeenv.serve.engine.job import Job, Settled
from placeenv.serve.engine.forward import forward
from placeenv.serve.engine.generation import Generation, Slots
from placeenv.serve.engine.replica import Holding, Slot, finalize_all, stage
from placeenv.serve.models.base import NOT_SERVING, SERVING, Model, ModelError, Serving
from placeenv.serve.models.repository import read
from placeenv.serve.protocol.errors import ModelFailed, Timeout
from placeenv.serve.protocol.request import Work


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def job_of(loop, answers: dict, name: str, model=("m", 1), deadline: float = 1e12, **given) -> Job:
    """A job whose answer goes to ``answers[name]``, as (answer, error), once the loop has turned."""
    job = Job(model=model, request=Work(model[0], model[1], 1, [], 0.0, deadline, False), inputs={"x": name},
              batched=True, loop=loop, future=None, **given)
    job.future = Settled(lambda answer, error: answers.__setitem__(name, (answer, error)))
    return job


def turn(loop) -> None:
    loop.run_until_complete(asyncio.sleep(0))


def test_a_failed_batch_runs_again_request_by_request_and_the_bad_one_fails_alone(loop):
    answers, attempts = {}, []

    def attempt(jobs):
        attempts.append([job.inputs["x"] for job in jobs])
        if any(job.inputs["x"] == "bad" for job in jobs):
            raise ValueError("cannot read bad")
        for job in jobs:
            job.resolve(job.inputs["x"].upper())

    jobs = [job_of(loop, answers, name) for name in ("a", "bad", "c")]
    run_batch(jobs, "m", attempt)
    turn(loop)
    assert attempts == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    assert answers["a"] == ("A", None) and answers["c"] == ("C", None)
    error = answers["bad"][1]
    assert isinstance(error, ModelFailed)
    assert "model 'm' failed on this request: ValueError: cannot read bad" in str(error)
    assert all(job.started for job in jobs)


def test_a_job_past_its_deadline_is_answered_timeout_and_not_run(loop):
    answers, ran = {}, []
    jobs = [job_of(loop, answers, "late", deadline=5.0), job_of(loop, answers, "on-time", deadline=20.0)]

    def attempt(live):
        ran.extend(job.inputs["x"] for job in live)
        for job in live:
            job.resolve("ok")

    run_batch(jobs, "m", attempt, clock=lambda: 10.0)
    turn(loop)
    assert ran == ["on-time"] and answers["on-time"] == ("ok", None)
    assert isinstance(answers["late"][1], Timeout)


def test_a_batchs_context_is_set_by_a_token_pair_and_left_as_it_was_after():
    outer, inner = Serving({"who": "outer"}), Serving({"who": "inner"})
    assert SERVING.get() is NOT_SERVING
    token = SERVING.set(outer)
    try:
        inner_token = SERVING.set(inner)  # a batch served while the outer one's call waits
        assert SERVING.get() is inner
        SERVING.reset(inner_token)
        assert SERVING.get() is outer
        seen = []
        thread = threading.Thread(target=lambda: seen.append(SERVING.get()))
        thread.start()
        thread.join()
        assert seen == [NOT_SERVING]  # another thread does not see it
    finally:
        SERVING.reset(token)
    assert SERVING.get() is NOT_SERVING


def test_a_call_from_a_thread_the_engine_did_not_start_is_refused_even_with_the_context_copied():
    made = []

    def call(model, version, requests, outputs, context, parameters, anywhere):
        made.append(model)
        return [{"y": np.zeros(1)}]

    model = Model()
    failed = {}

    def from_another(run_in=None):
        def attempt():
            try:
                model.infer("other", {"x": np.zeros(1)})
            except ModelError as exc:
                failed["copied" if run_in is not None else "bare"] = str(exc)
        thread = threading.Thread(target=(lambda: run_in.run(attempt)) if run_in is not None else attempt)
        thread.start()
        thread.join()

    token = SERVING.set(Serving(None, call, thread=threading.get_ident()))
    try:
        assert model.infer("other", {"x": np.zeros(1)}) == {"y": np.zeros(1)}  # the control: its own thread
        from_another()
        from_another(contextvars.copy_context())
    finally:
        SERVING.reset(token)
    assert made == ["other"]
    assert "this thread" in failed["bare"] and "serves none" in failed["bare"]
    assert "not on another" in failed["copied"] and "even with its context copied" in failed["copied"]


def test_a_worker_waiting_for_a_call_serves_its_queues_other_models_never_one_in_hand(loop):
    queue = DeviceQueue("cpu", 8, 1)
    served = {model: SimpleNamespace(replicas=Slots({"cpu/0": None}), devices=frozenset({"cpu"}),
                                     everywhere=frozenset({"cpu"}), limits=(4, 0.0)) for model in ("a", "b")}
    answered = concurrent.futures.Future()
    ran = []

    def run(batch):
        calls.hand.append(batch)
        ran.append([job.inputs["x"] for job in batch])
        if batch[0].model == ("b", 1):
            answered.set_result(None)  # the call it waited for
        calls.hand.pop()
        queue.done(len(batch))

    calls = Calls("cpu/0", "cpu", queue, None, run)
    answers = {}
    in_hand = [job_of(loop, answers, "a-running", model=("a", 1), served=served["a"])]
    for name, model in (("a-queued", "a"), ("b-queued", "b")):
        assert queue.offer(job_of(loop, answers, name, model=(model, 1), served=served[model]))
    calls.hand.append(in_hand)
    calls.serve_until(answered, deadline=float("inf"))
    assert ran == [["b-queued"]] and answered.done()
    assert [job.inputs["x"] for job in queue.take_unstarted()] == ["a-queued"]  # its own model waits
    assert calls.jobs() == in_hand


def test_replicas_are_built_on_the_calling_thread_and_a_replacement_refills_its_slot():
    found = read([Path(TEST_REPOSITORY)], ["affine"], max_batch_size=8, max_batch_delay_ms=0)
    entry = found.entries["affine"]
    slot = Slot("cpu/0", "cpu", placeenv.to_place("cpu"), PlaceChecker("cpu/0", "cpu"), True)
    built, failed = Holding(slot, [entry]).load()
    assert not failed and set(built) == {("affine", 1)}
    replica = built["affine", 1]
    x = np.ones((2, 4), dtype=np.float32)
    np.testing.assert_allclose(forward(replica, [{"x": x}], True, 2)["y"], x * 2 + 1)
    # A generation serves it; the worker dies and lets go of what it holds (its replica finalized), and a
    # replacement under the same name refills its slot. The control: another slot's worker holds nothing.
    generation = Generation.build(found.entries, {}, {("affine", 1): {"cpu/0": replica}}, {"cpu": 1})
    served = SimpleNamespace(generation=generation, retiring=[])
    assert Holding(Slot("cpu/1", "cpu", slot.place, slot.check, True), [], served, True).load() == ({}, {})
    Holding(slot, [entry], served).release()  # (as the first worker of the slot ends)
    assert replica.network is None
    assert Holding(slot, [], served, replacement=True).load() == ({}, {})
    fresh = generation.versions["affine", 1].replicas["cpu/0"]
    assert fresh is not replica and fresh.network is not None
    np.testing.assert_allclose(forward(fresh, [{"x": x}], True, 2)["y"], x * 2 + 1)
    staged = stage(slot, entry, [1])  # a load's build, beside what is served
    finalize_all([fresh, *staged.values()], slot.name)
    assert fresh.network is None and staged["affine", 1].network is None
