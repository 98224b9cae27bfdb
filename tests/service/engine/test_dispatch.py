"""Batching on a device's queue (``DeviceQueue``): who wakes whom.

A worker gathering a batch is woken when the queue may fill it, not by every job, and sends it when
requests stop arriving; another model's arrivals do not keep it waiting. A batch joins jobs of one
model and one shape (each input's dims after the first), the rest keeping their order and priority.
The queue runs on ``support.ManualClock``, so every wait is the clock's, not the machine's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from support import ManualClock, wait_until

from placeenv.serve.engine.dispatch import DeviceQueue
from placeenv.serve.engine.job import Job, Settled, shape_key
from placeenv.serve.engine.forward import Handed
from placeenv.serve.engine.generation import Slots
from placeenv.serve.protocol.request import Work

#: The one worker of each test's queue.
WORKER = "cpu/0"
_SERVED: dict = {}


def served_of(model: tuple[str, int]) -> SimpleNamespace:
    """What a queue reads of a job's served version (generation.py's ``ServedVersion``): its replicas by
    worker (the one worker here holds every model but ``gone``), its devices, those where every worker
    holds it, and its batch limits (set by ``_limits``). One for each model, as a generation has."""
    if model not in _SERVED:
        holders = {} if model[0] == "gone" else {WORKER: None}
        _SERVED[model] = SimpleNamespace(replicas=Slots(holders), devices=frozenset({"cpu"}),
                                         everywhere=frozenset({"cpu"}) if holders else frozenset(), limits=(8, 0.0))
    return _SERVED[model]


def _limits(limits: dict) -> None:
    """Each model's batch limits: (max examples, max delay)."""
    for model, found in limits.items():
        served_of(model).limits = found


def _job(loop, model: tuple[str, int] = ("m", 1), shape: tuple | None = None) -> Job:
    request = Work(model[0], model[1], 1, [], time.perf_counter(), time.perf_counter() + 60, False)
    return Job(model=model, request=request, inputs={}, batched=True, loop=loop,
               future=Settled(lambda answer, error: None), shape=shape, served=served_of(model))


def _gathering(limit: int = 4, delay: float = 2.0):
    """A queue on a hand-driven clock, two jobs in it, and a worker gathering them into a batch
    (started, and waiting on the clock). Returns (queue, clock, loop, found, thread); ``found``
    gets the batch once the worker is done."""
    clock = ManualClock()
    queue = DeviceQueue("cpu", 64, 1, clock=clock)
    loop = asyncio.new_event_loop()
    for _ in range(2):  # two queued: the worker takes both, and gathers for more
        queue.offer(_job(loop))
    found: list = []
    _limits({("m", 1): (limit, delay)})
    thread = threading.Thread(target=lambda: found.extend(queue.take_batch(WORKER, wait=5)))
    thread.start()
    wait_until(lambda: clock.sleeping == 1, 5, "the worker did not start gathering")
    return queue, clock, loop, found, thread


def _went(clock: ManualClock, thread: threading.Thread) -> float:
    """When the batch went: the end of the worker's last wait (nothing waits after it)."""
    thread.join(5)
    assert not thread.is_alive(), "the worker is still gathering"
    return clock.log[-1][2]


@pytest.mark.parametrize("jobs, full", [(4, True), (3, False)])
def test_a_gathering_worker_wakes_when_the_queue_can_fill_its_batch(jobs, full):
    queue, clock, loop, found, thread = _gathering()
    try:
        for _ in range(jobs - 2):
            queue.offer(_job(loop))
        if not full:
            clock.advance(0.1)  # the first look: a job joined
            clock.advance(0.1)  # the second: none did
        took = _went(clock, thread)
        assert len(found) == jobs
        # Full: woken at once, by the second job (2 more may fill it; the first did not wake it), with
        # no time passing. Not full (the control): nothing woke it; it went after two looks (a
        # twentieth of its 2 s delay each), the second finding that nobody had joined.
        if full:
            assert clock.log == [("notified", 0.1, 0.0)] and took == 0.0, clock.log
        else:
            assert clock.log == [("timed out", 0.1, 0.1), ("timed out", 0.1, pytest.approx(0.2))], clock.log
            assert took == pytest.approx(0.2), took
    finally:
        loop.close()


@pytest.mark.parametrize("gap", [0.05, 1.0])
def test_a_batch_waits_while_requests_keep_arriving_and_goes_when_they_pause(gap):
    # A job every `gap` s, 4 of them, after the first two: within a look (a twentieth of a 4 s
    # delay) they all join the batch; the control, one a second, finds the worker gone after the
    # first quiet look.
    queue, clock, loop, found, thread = _gathering(limit=16, delay=4.0)
    try:
        for _ in range(4):
            clock.advance(gap)
            queue.offer(_job(loop))
        clock.advance(4.0)  # the rest of the delay: the worker goes at its first quiet look
        took = _went(clock, thread)
        assert all(how == "timed out" for how, _, _ in clock.log), clock.log  # no offer woke it
        if gap < 0.2:
            # Looks at 0.2 (3 had joined), 0.4 (the 4th), 0.6 (none): it went there.
            assert len(found) == 6 and 0.35 <= took < 2.0 and took == pytest.approx(0.6), (len(found), took)
        else:
            assert len(found) == 2 and len(queue) == 4 and took < 0.9 and took == pytest.approx(0.2), \
                (len(found), took)
    finally:
        loop.close()


NARROW, WIDE = ((3,),), ((5,),)  # the shape keys of one input [n, 3] and [n, 5]


@pytest.mark.parametrize("other", [{"model": ("other", 1)}, {"shape": WIDE}], ids=["model", "shape"])
def test_another_models_or_shapes_arrivals_do_not_keep_a_batch_waiting(other):
    # A job of another model (or of "m" in another shape) every 0.05 s for 1.5 s, while a worker gathers
    # a batch of "m" with a 4 s delay (looks of 0.2 s): the batch goes at the first look that finds none
    # it could take joined. The control, counting every model's jobs as joining, held it until the
    # arrivals stopped (1.5 s+).
    queue, clock, loop, found, thread = _gathering(limit=16, delay=4.0)
    try:
        for _ in range(30):
            clock.advance(0.05)
            queue.offer(_job(loop, **other))
        took = _went(clock, thread)
        assert len(found) == 2 and 0.19 <= took < 1.0 and took == pytest.approx(0.2), (len(found), took)
        assert clock.log == [("timed out", 0.2, pytest.approx(0.2))], clock.log
        assert all(job.model == ("m", 1) and job.shape is None for job in found)
        assert len(queue) == 30  # the other jobs, untouched
    finally:
        loop.close()


def _queue(loop, jobs: list[tuple[str, int]]) -> tuple[DeviceQueue, dict[str, Job]]:
    """A queue holding a job for each (name, priority) of ``jobs``, offered in that order; the jobs by name."""
    queue = DeviceQueue("cpu", 64, 1, clock=ManualClock())
    made = {}
    for name, priority in jobs:
        made[name] = _job(loop, ("other", 1) if name.startswith("o") else ("m", 1))
        made[name].request.priority = priority
        assert queue.offer(made[name])
    return queue, made


def _taken(queue: DeviceQueue, limits) -> list[list[Job]]:
    """Every batch a worker takes from ``queue`` until it is empty (none waits: the delay is 0)."""
    _limits(limits)
    batches = []
    while len(queue):
        batches.append(queue.take_batch(WORKER, wait=0))
    return batches


def test_a_high_priority_job_is_taken_before_every_normal_job_already_queued():
    # Normal jobs n1..n3, then h1 and h2 of priority 1: one at a time, the highs come first, in their
    # own arrival order, then the normal ones in theirs. The control: the same jobs at priority 0 keep
    # their arrival order.
    loop = asyncio.new_event_loop()
    try:
        one = {("m", 1): (1, 0.0)}
        for high, expected in ((1, ["h1", "h2", "n1", "n2", "n3"]), (0, ["n1", "n2", "n3", "h1", "h2"])):
            queue, made = _queue(loop, [("n1", 0), ("n2", 0), ("n3", 0), ("h1", high), ("h2", high)])
            names = {id(job): name for name, job in made.items()}
            assert [names[id(b[0])] for b in _taken(queue, one)] == expected, high
    finally:
        loop.close()


def test_a_batch_begun_by_a_high_priority_job_is_still_of_one_model():
    # o1 (another model) and n1 queued, then h1 of "m" at priority 1: the first batch is h1 and n1 (its
    # model's, in queue order), o1 waits for its own; a high job of the other model, offered after,
    # is still taken before it.
    loop = asyncio.new_event_loop()
    try:
        queue, made = _queue(loop, [("o1", 0), ("n1", 0), ("h1", 1)])
        _limits({("m", 1): (8, 0.0), ("other", 1): (8, 0.0)})
        first = queue.take_batch(WORKER, wait=0)
        assert first == [made["h1"], made["n1"]]
        high_other = _job(loop, ("other", 1))
        high_other.request.priority = 1
        queue.offer(high_other)
        assert queue.take_batch(WORKER, wait=0) == [high_other, made["o1"]]
        assert len(queue) == 0
    finally:
        loop.close()


def test_a_cancelled_job_leaves_its_queue_and_is_answered_once():
    # h1 (high) and n1 are cancelled while queued: each is answered Cancelled ("queued"), once, and leaves
    # the queue, which keeps its order for the rest (h2 still ahead of the normal jobs). The control, n2,
    # is not cancelled and is taken.
    loop = asyncio.new_event_loop()
    try:
        queue, made = _queue(loop, [("n1", 0), ("n2", 0), ("h1", 1)])
        answers = []
        for job in made.values():
            job.future = Settled(lambda value, error, answers=answers: answers.append(error))
        assert made["h1"].cancel() and made["n1"].cancel()
        assert not made["h1"].cancel()  # answered already: a second cancel does nothing
        h2 = _job(loop)
        h2.request.priority = 1
        queue.offer(h2)
        assert [b[0] for b in _taken(queue, {("m", 1): (1, 0.0)})] == [h2, made["n2"]]
        loop.run_until_complete(asyncio.sleep(0))  # the answers are set on the loop, as a worker's are
        assert [type(e).__name__ for e in answers] == ["Cancelled", "Cancelled"]
        assert {e.stage for e in answers} == {"queued"}
        assert not made["n2"].answered and made["n1"].answered and made["h1"].answered
    finally:
        loop.close()


def test_a_cancel_past_the_deadline_is_the_deadlines_answer():
    loop = asyncio.new_event_loop()
    try:
        queue, made = _queue(loop, [("n1", 0), ("n2", 0)])
        answers = []
        for job in made.values():
            job.future = Settled(lambda value, error, answers=answers: answers.append(error))
        made["n1"].request.deadline = time.perf_counter() - 1  # its deadline passed while it waited
        assert made["n1"].cancel() and made["n2"].cancel()
        loop.run_until_complete(asyncio.sleep(0))
        assert [type(e).__name__ for e in answers] == ["Timeout", "Cancelled"]
    finally:
        loop.close()


def test_a_version_no_worker_here_holds_blocks_no_one_and_its_jobs_are_withdrawn():
    """A version whose replicas name no worker of this queue (an unload whose drain stopped waiting): the
    worker takes the jobs behind its jobs, and withdrawing its replicas takes its jobs out (the control:
    another version's replicas withdraw none)."""
    loop = asyncio.new_event_loop()
    try:
        queue = DeviceQueue("cpu", 64, 1, clock=ManualClock())
        for model in (("gone", 1), ("m", 1), ("gone", 1), ("m", 1)):
            assert queue.offer(_job(loop, model))
        _limits({("m", 1): (8, 0.0)})
        taken = queue.take_batch(WORKER, wait=0)
        assert [job.model for job in taken] == [("m", 1), ("m", 1)] and len(queue) == 2
        assert queue.withdraw({served_of(("m", 1)).replicas}) == []
        assert [job.model for job in queue.withdraw({served_of(("gone", 1)).replicas})] == [("gone", 1)] * 2
        assert len(queue) == 0
    finally:
        loop.close()


# -- batches by shape: a batch joins one model's jobs of one shape (Job.shape, shape_key) --------------


def test_the_shape_key_is_each_inputs_dims_after_the_first_and_leaves_padded_dims_out():
    narrow = {"x": np.zeros((2, 3, 7), np.float32), "ids": np.zeros((2, 4), np.int64)}
    wide = {"x": np.zeros((1, 5, 7), np.float32), "ids": np.zeros((1, 4), np.int64)}
    assert shape_key(narrow, {}) == ((3, 7), (4,))  # the batch dimension, 2, is not in it
    assert shape_key(narrow, {}) != shape_key(wide, {})
    padded = {"x": ((1,), 0.0)}
    assert shape_key(narrow, padded) == shape_key(wide, padded) == ((-1, 7), (4,))
    # The other dims still part them: padding dim 1 does not join a different dim 2.
    assert shape_key({**wide, "x": np.zeros((1, 5, 8), np.float32)}, padded) != shape_key(narrow, padded)
    # Tensors and a step's Handed rows have the same key as the arrays they hold.
    tensor = paddle.to_tensor(np.zeros((6, 3, 7), np.float32))
    assert shape_key({"x": tensor, "ids": narrow["ids"]}, {}) == shape_key(narrow, {})
    assert shape_key({"x": Handed(tensor, "cpu", (2, 4)), "ids": narrow["ids"]}, {}) == shape_key(narrow, {})
    # One input (the key of its dims alone), as an array, a tensor and a step's rows.
    one = [{"x": np.zeros((2, 3, 7), np.float32)}, {"x": tensor}, {"x": Handed(tensor, "cpu", (1, 2))}]
    assert [shape_key(inputs, {}) for inputs in one] == [(3, 7)] * 3
    assert shape_key({"x": np.zeros((2, 5, 7), np.float32)}, {}) != (3, 7)


def _shaped(loop, jobs: list[tuple[str, tuple, int]]) -> tuple[DeviceQueue, dict[str, Job]]:
    """A queue holding a job of model "m" for each (name, shape, priority), offered in that order."""
    queue = DeviceQueue("cpu", 64, 1, clock=ManualClock())
    made = {}
    for name, shape, priority in jobs:
        made[name] = _job(loop, shape=shape)
        made[name].request.priority = priority
        assert queue.offer(made[name])
    return queue, made


def _names(batches: list[list[Job]], made: dict[str, Job]) -> list[list[str]]:
    names = {id(job): name for name, job in made.items()}
    return [[names[id(job)] for job in batch] for batch in batches]


def test_a_batch_joins_only_jobs_of_its_first_jobs_shape_and_the_rest_keep_their_order():
    # n1..n4 narrow and w1..w4 wide, interleaved: a batch of each shape, in queue order, the narrow first
    # (its first job is the head). The control: the same jobs with no shape (a model of fixed dims) are one.
    loop = asyncio.new_event_loop()
    try:
        limits = {("m", 1): (8, 0.0)}
        order = [("n1", NARROW), ("w1", WIDE), ("n2", NARROW), ("w2", WIDE), ("w3", WIDE), ("n3", NARROW),
                 ("n4", NARROW), ("w4", WIDE)]
        queue, made = _shaped(loop, [(name, shape, 0) for name, shape in order])
        assert _names(_taken(queue, limits), made) == [["n1", "n2", "n3", "n4"], ["w1", "w2", "w3", "w4"]]
        queue, made = _shaped(loop, [(name, None, 0) for name, _ in order])
        assert _names(_taken(queue, limits), made) == [[name for name, _ in order]]
        # A full batch leaves the rest of its shape in line, ahead of the shapes behind it.
        queue, made = _shaped(loop, [(name, shape, 0) for name, shape in order])
        two = {("m", 1): (2, 0.0)}
        assert _names(_taken(queue, two), made) == [["n1", "n2"], ["w1", "w2"], ["w3", "w4"], ["n3", "n4"]]
    finally:
        loop.close()


def test_a_high_priority_job_begins_a_batch_of_its_own_shape_ahead_of_normal_ones():
    # n1 (narrow), w1 (wide), n2 (narrow) queued, then h1 (wide, priority 1): the first batch is h1 and
    # w1, its shape's, in queue order; then the narrow ones. The control, h1 at priority 0: n1's batch first.
    loop = asyncio.new_event_loop()
    try:
        limits = {("m", 1): (8, 0.0)}
        for high, expected in ((1, [["h1", "w1"], ["n1", "n2"]]), (0, [["n1", "n2"], ["w1", "h1"]])):
            jobs = [("n1", NARROW, 0), ("w1", WIDE, 0), ("n2", NARROW, 0), ("h1", WIDE, high)]
            queue, made = _shaped(loop, jobs)
            assert _names(_taken(queue, limits), made) == expected, high
    finally:
        loop.close()
