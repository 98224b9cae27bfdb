"""What the engine counts of each served version and pipeline (Triton's ``ModelStatistics``), a
request's timings, and the metrics of a request withdrawn (its deadline, or its client gone)."""

from __future__ import annotations

import dataclasses
import time

from .. import metrics
from ..protocol.errors import Cancelled, ServiceError
from ..protocol.request import Work
from .job import Job
from .forward import Answer


@dataclasses.dataclass(slots=True)
class Stats:
    """Per model version, Triton's statistics (``ModelStatistics``): requests answered and failed, the
    examples they held, the batches that ran, and cumulative nanoseconds per stage. Each request counts
    its batch's stages, as Triton's do; the batch itself is counted once, by its size."""

    success: int = 0
    success_ns: int = 0
    fail: int = 0
    fail_ns: int = 0
    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    inferences: int = 0  # examples answered
    executions: int = 0  # forward passes (a pipeline's: its requests answered)
    last_inference_ms: int = 0
    batches: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # size -> [count, ns of each stage]

    def succeeded(self, taken: float, job: Job, answer: Answer) -> None:
        """A job taken at ``taken`` (its request's arrival, or its step's), answered by a worker."""
        self.success += 1
        self.success_ns += int((time.perf_counter() - taken) * 1e9)
        self.queue_ns += int((answer.compute_started - job.enqueued) * 1e9)
        self.inferences += job.request.examples
        self.last_inference_ms = int(time.time() * 1000)
        for batch in answer.batches:  # (more than one for a job run as parts: forward.split)
            self.input_ns += batch.input_ns
            self.infer_ns += batch.infer_ns
            self.output_ns += batch.output_ns
            if not batch.counted:  # its first job answered here: the other jobs of the batch share it
                batch.counted = True
                self.executions += 1
                row = self.batches.get(batch.size)
                if row is None:
                    row = self.batches[batch.size] = [0, 0, 0, 0]
                row[0] += 1
                row[1] += batch.input_ns
                row[2] += batch.infer_ns
                row[3] += batch.output_ns

    def pipeline_succeeded(self, taken: float, examples: int, queue_ms: float, stages: list[int]) -> None:
        """A pipeline's request taken at ``taken``: its steps' time in their queues and the stages of
        their batches (``stages``: ns of input, infer, output), summed, as Triton's ensembles report."""
        self.success += 1
        self.success_ns += int((time.perf_counter() - taken) * 1e9)
        self.queue_ns += int(queue_ms * 1e6)
        self.input_ns += stages[0]
        self.infer_ns += stages[1]
        self.output_ns += stages[2]
        self.inferences += examples
        self.executions += 1
        self.last_inference_ms = int(time.time() * 1000)

    def failed(self, taken: float) -> None:
        self.fail += 1
        self.fail_ns += int((time.perf_counter() - taken) * 1e9)

    def describe(self, name: str, version: int) -> dict:
        """Triton's ``ModelStatistics`` of this version, as its HTTP endpoint writes it (numbers, not strings)."""
        pair = lambda count, ns: {"count": count, "ns": ns}
        done = self.success
        return {
            "name": name, "version": str(version), "last_inference": self.last_inference_ms,
            "inference_count": self.inferences, "execution_count": self.executions,
            "inference_stats": {
                "success": pair(done, self.success_ns), "fail": pair(self.fail, self.fail_ns),
                "queue": pair(done, self.queue_ns), "compute_input": pair(done, self.input_ns),
                "compute_infer": pair(done, self.infer_ns), "compute_output": pair(done, self.output_ns),
                "cache_hit": pair(0, 0), "cache_miss": pair(0, 0),  # no response cache
            },
            "batch_stats": [
                {"batch_size": size, "compute_input": pair(count, input_ns), "compute_infer": pair(count, infer_ns),
                 "compute_output": pair(count, output_ns)}
                for size, (count, input_ns, infer_ns, output_ns) in sorted(self.batches.items())],
        }


def timings(taken: float, job: Job, answer: Answer) -> dict[str, float]:
    """Milliseconds of a job taken at ``taken``: preprocessing, in its queue, computing (its batch's
    forward pass and the hop back), in all."""
    done = time.perf_counter()
    return {
        "preprocess_ms": round((job.enqueued - taken) * 1000, 3),
        "queue_ms": round((answer.compute_started - job.enqueued) * 1000, 3),
        "compute_ms": round((done - answer.compute_started) * 1000, 3),
        "total_ms": round((done - taken) * 1000, 3),
    }


def withdrawn(work: Work, error: ServiceError, ran: bool) -> None:
    """Count a request answered ``Timeout`` (whose deadline it was, and whether a worker had begun on it:
    ``ran``) or ``Cancelled`` (where its cancel found it)."""
    if isinstance(error, Cancelled):
        metrics.child(metrics.CANCELLED, work.model, error.stage).inc()
    else:
        metrics.child(metrics.EXPIRED, work.model, "client" if work.own_deadline else "service",
                      "running" if ran else "queued").inc()
