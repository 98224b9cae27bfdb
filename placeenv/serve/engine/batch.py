"""A batch's one answer per job, whatever its forward pass does (the failure policy), and the place checks
that count a leak.

``run_batch`` is what a worker does with each batch it takes: a job whose deadline passed in the queue is
answered 504; the rest run together (``attempt``, the worker's forward pass); when that fails, a batch of
several runs again request by request, so one bad request does not fail its batch-mates, and a failure
is its request's answer (``failure``). No thread and no device: a test runs it with plain functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .. import metrics
from ..models.base import InputError
from ..protocol.errors import Draining, InvalidInput, ModelFailed, Overloaded, ServiceError, Timeout
from .job import Job

log = logging.getLogger(__name__)

#: What a model's call to another (``Model.infer``) answers when it fails, as it is: the request the
#: call was made for gets the same answer (a deadline passed, every queue full, the service stopping).
PASSED_ON = (Timeout, Overloaded, Draining)


def failure(model: str, exc: Exception) -> ServiceError:
    """The answer of a request whose model raised ``exc``."""
    if isinstance(exc, PASSED_ON):
        return exc
    if isinstance(exc, InputError):  # the model says the request cannot be run as sent: the client's 400
        return InvalidInput(f"model {model!r}: {exc}")
    return ModelFailed(f"model {model!r} failed on this request: {type(exc).__name__}: {str(exc)[:500]}")


def run_batch(jobs: list[Job], model: str, attempt: Callable[[list[Job]], None], queued=None,
              clock: Callable[[], float] = time.perf_counter) -> None:
    """Answer each of ``jobs`` once: those past their deadline ``Timeout``, the rest by ``attempt(live)``
    (which answers them or raises); a failed attempt of several jobs is made again for each job alone,
    and a job whose attempt fails is answered ``failure(model, exc)``. ``queued``: the histogram that
    observes each live job's time in the queue."""
    now = clock()
    live = []
    for job in jobs:
        if job.answered:  # (a timer or a cancel answered it meanwhile)
            continue
        if job.request.deadline > now:
            live.append(job)
        else:
            job.expire()  # its deadline passed in the queue
    if not live:
        return
    for job in live:
        job.started = now
        if queued is not None:
            queued.observe(now - job.enqueued)
    try:
        attempt(live)
    except Exception as exc:  # noqa: BLE001 - a model's failure is the request's answer
        if len(live) == 1:
            live[0].fail(failure(model, exc))
            return
        log.warning("model %r: a batch of %d requests failed (%s: %s); running each alone", model, len(live),
                    type(exc).__name__, str(exc)[:200])
        for job in live:
            if job.answered:
                continue
            if job.request.deadline <= clock():
                job.expire()
                continue
            try:
                attempt([job])
            except Exception as alone:  # noqa: BLE001
                job.fail(failure(model, alone))


class PlaceChecker:
    """Counts every place check; a mismatch is a leak, counted with its labels and logged."""

    def __init__(self, worker: str, device: str) -> None:
        self.worker, self.device = worker, device

    def __call__(self, stage: str, actual: str, expected: str | None = None) -> bool:
        expected = self.device if expected is None else expected
        metrics.child(metrics.PLACE_CHECKS, stage, self.device).inc()
        if actual == expected:
            return True
        metrics.DEVICE_LEAKS.labels(self.worker, expected, actual, stage).inc()
        log.warning("device leak: worker %s stage %s expected %s got %s", self.worker, stage, expected, actual)
        return False


def step_checker(check: PlaceChecker, jobs: list[Job]):
    """``check``, which for a pipeline's steps among ``jobs`` counts a leak for each step too."""
    steps = {job.options.step for job in jobs if job.options.step is not None}
    if not steps:
        return check

    def checked(stage: str, actual: str, expected: str | None = None) -> bool:
        if check(stage, actual, expected):
            return True
        for pipeline, step in steps:
            metrics.child(metrics.STEP_LEAKS, pipeline, step, stage).inc()
        return False

    return checked
