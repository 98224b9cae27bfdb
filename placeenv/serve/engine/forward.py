"""The one forward pass over a batch, as every worker runs it (and tests compare models against it),
and what it joins and answers: ``Handed`` step tensors, padded inputs, a job queued as parts.

No thread, no queue: ``worker.py`` calls ``forward`` for each batch it takes and ``answer_batch`` for its
jobs' answers, ``replica.py`` calls ``forward`` for each warm-up request, ``standalone.py`` for one
request outside the service.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import msgspec
import numpy as np
import paddle

import placeenv

from .job import Job, Settled, resolve_all
from ..models.base import Model, batch_tensor, move_to, request_tensor



@dataclasses.dataclass(slots=True)
class Batch:
    """One forward pass, as Triton's statistics count it: its examples and the nanoseconds of its stages
    (joining the inputs and moving them to the device, ``execute``, postprocess and host arrays). Its
    jobs' answers share it; the engine counts it once (``counted``), on the event loop thread, after
    the worker has let go of it."""

    size: int
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    counted: bool = False


@dataclasses.dataclass(frozen=True)
class Answer:
    """What a worker returns for one job: the job's slice of the batch's outputs, as host arrays."""

    outputs: dict[str, np.ndarray]
    device: str
    worker: str
    batch_size: int  # examples in the forward pass this job shared
    compute_started: float
    batch: Batch | None = None  # the forward pass this job shared, for the statistics
    more: tuple[Batch, ...] = ()  # the other forward passes of a job run as parts (``split``)

    @property
    def batches(self) -> tuple[Batch, ...]:
        return (self.batch, *self.more) if self.more else (self.batch,)


@dataclasses.dataclass(frozen=True, slots=True)
class Handed:
    """A step's output handed to the next step as the tensor ``execute`` made, not as a host array; with
    the device it is on, so the next step moves it only when it runs elsewhere. The jobs of one batch
    share its tensor, each its ``rows`` (start, stop; None: all of it): slicing a tensor costs a Paddle
    call a job, and a next step that batches the same jobs in the same order takes it whole."""

    tensor: paddle.Tensor
    device: str
    rows: tuple[int, int] | None = None

    @property
    def shape(self) -> list[int]:
        shape = self.tensor.shape
        return shape if self.rows is None else [self.rows[1] - self.rows[0], *shape[1:]]

    @property
    def taken(self) -> paddle.Tensor:
        """Its rows of the tensor, where it is (the tensor itself when they are all of it)."""
        return self.tensor if self.rows is None else self.tensor[self.rows[0]:self.rows[1]]


def unchecked(stage: str, actual: str, expected: str | None = None) -> bool:
    return True


def forward(replica: Model, inputs: list[dict], batched: bool, examples: int, check=unchecked,
            keep: frozenset[str] = frozenset(), stamps: list[float] | None = None) -> dict:
    """One forward pass of ``replica`` over some requests' preprocessed inputs, as every worker runs it:
    one host tensor per input for them all, moved to the replica's place, ``execute``, ``postprocess``;
    the declared outputs as host arrays, of ``examples`` rows each when ``batched``. ``check`` is the
    worker's ``PlaceChecker``: where each tensor is, at each stage.

    A pipeline's steps: an input may be a step's ``Handed`` tensor, joined where it is and moved only
    when it is elsewhere; the outputs in ``keep`` (the model's postprocess is the default, ``numpy()``)
    stay the tensors ``execute`` made, for the next step.

    ``stamps``, when given, gets ``time.perf_counter()`` at the start, once the inputs are on the device,
    once ``execute`` has returned and once the outputs are host arrays: Triton's compute_input,
    compute_infer and compute_output of the batch."""
    if stamps is not None:
        stamps.append(time.perf_counter())
    context = replica.context
    moved = _inputs_on(replica, inputs, check)
    if stamps is not None:
        stamps.append(time.perf_counter())
    out = replica.execute(moved)
    # The thread's device after the forward: the one check that sees a leak for a saved program
    # on sim, whose outputs are CPU tensors whatever device it ran on (docs/service.md).
    check("execute", paddle.get_device())
    expected = replica.output_device()
    for tensor in out.values():
        if not isinstance(tensor, np.ndarray):  # (an execute that works on the host may give arrays)
            check("output", placeenv.device_name(tensor.place), expected)
    if stamps is not None:
        stamps.append(time.perf_counter())
    results = replica.postprocess({n: t for n, t in out.items() if n not in keep} if keep else out)
    # A Predictor's outputs are its output variables, which its next run writes over: a kept one is copied.
    results.update((name, out[name] if replica.predictor is None else out[name].clone()) for name in keep)
    missing = [spec.name for spec in context.outputs if spec.name not in results]
    if missing:
        raise RuntimeError(f"postprocess returned no {', '.join(missing)} (declared outputs)")
    if batched:  # (requests share a forward pass only when their model batches)
        short = [n for n, a in results.items() if rows_of(a) != examples]
        if short:
            raise RuntimeError(f"outputs {short} do not have the batch's {examples} rows")
    found = {spec.name: results[spec.name] if spec.name in keep else np.asarray(results[spec.name])
             for spec in context.outputs}
    if stamps is not None:
        stamps.append(time.perf_counter())
    return found


def _inputs_on(replica: Model, inputs: list[dict], check) -> dict:
    """Each input of the batch's requests as one tensor on ``replica``'s place: host arrays joined into
    one host tensor and moved, a step's ``Handed`` tensors joined where they are (``_joined``), the dims
    its model pads padded first. A model that ``takes_arrays`` gets host arrays (``_arrays``)."""
    context = replica.context
    on_host = placeenv.device_name(replica.place) == "cpu"  # a CPU worker: its host tensors are in place
    moved = {}
    padding = context.padding
    for spec in context.inputs:
        parts = [request[spec.name] for request in inputs]
        handed = any(isinstance(part, Handed) for part in parts)  # (a padded one is a tensor where it was)
        if padding and len(parts) > 1 and spec.name in padding:
            parts = padded(parts, *padding[spec.name])
        if replica.takes_arrays:
            moved[spec.name] = _arrays(parts)
            continue
        if handed:
            tensor = _joined(parts, replica.place)
        else:
            host = batch_tensor(parts)
            check("preprocess", placeenv.device_name(host.place), "cpu")
            tensor = host if on_host else move_to(host, replica.place)
        moved[spec.name] = tensor
        check("batch", placeenv.device_name(tensor.place))
    return moved


def _arrays(parts: list) -> np.ndarray:
    """A batch's parts of one input as one host array: a request's own array when the batch is one (no
    copy), the parts joined by numpy, a tensor part (a step's ``Handed`` rows) read back to the host."""
    arrays = [part if isinstance(part, np.ndarray) else (part.taken if isinstance(part, Handed) else part).numpy()
              for part in parts]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def answer_batch(jobs: list[Job], results: dict, batch: Batch, device: str, worker: str) -> None:
    """Answer each of ``jobs`` its rows of ``results`` (``forward``'s, in the jobs' order), once.

    Outputs kept as tensors (forward's ``keep``): a step that hands them on gets them as ``Handed``, a job
    that wants arrays (a request) as arrays, made once a batch. One on the host goes as an array to all: a
    job's rows of it cost no Paddle call, and the next step joins arrays as it joins requests'."""
    examples = batch.size
    tensors = {name: value for name, value in results.items() if not isinstance(value, np.ndarray)}
    kept: dict[str, str] = {}
    if tensors:
        kept = {name: where for name, value in tensors.items()
                if (where := placeenv.device_name(value.place)) != "cpu"}
        handed_to_all = kept.keys() & set.intersection(*(set(job.options.keep) for job in jobs))
        results = {name: value.numpy() if name in tensors else value
                   for name, value in results.items() if name not in handed_to_all}
    if len(jobs) == 1:
        job = jobs[0]
        part = results if not kept else {
            **results, **{name: Handed(tensors[name], kept[name]) for name in job.options.keep & kept.keys()}}
        job.resolve(Answer(part, device, worker, examples, job.started, batch))
        return
    answers, offset = [], 0
    for job in jobs:
        rows = (offset, offset + job.request.examples)
        handed = job.options.keep & kept.keys()
        part = {name: value[offset:rows[1]] for name, value in results.items() if name not in handed}
        part.update((name, Handed(tensors[name], kept[name], rows)) for name in handed)
        answers.append((job, Answer(part, device, worker, examples, job.started, batch)))
        offset = rows[1]
    resolve_all(answers)


def rows_of(value) -> int | None:
    """The first dimension of an array, a tensor or a ``Handed`` one (anything with a shape, or a list);
    None for a scalar."""
    shape = value.shape if hasattr(value, "shape") else np.shape(value)
    return int(shape[0]) if len(shape) else None


def sliced(value, start: int, stop: int):
    """Rows ``start:stop`` of a job's input: an array's or a tensor's slice, or a ``Handed`` tensor's rows."""
    if not isinstance(value, Handed):
        return value[start:stop]
    base = value.rows[0] if value.rows is not None else 0
    return Handed(value.tensor, value.device, (base + start, base + stop))


def padded(parts: list, dims: tuple[int, ...], value: float) -> list:
    """A batch's parts of one input, each padded at the end of ``dims`` with ``value`` up to the batch's
    largest (the config's ``batch_padding``): the jobs were joined by a shape that leaves those dims out."""
    shapes = [list(part.shape) for part in parts]
    largest = {d: max(shape[d] for shape in shapes) for d in dims}
    found = []
    for part, shape in zip(parts, shapes):
        widths = [(0, largest[d] - size if d in largest else 0) for d, size in enumerate(shape)]
        if not any(after for _, after in widths):
            found.append(part)
        elif isinstance(part, np.ndarray):
            found.append(np.pad(part, widths, constant_values=value))
        else:  # a tensor: padded where it is (a step's Handed rows taken out first)
            tensor = part.taken if isinstance(part, Handed) else part
            found.append(paddle.nn.functional.pad(tensor, [w for pair in widths for w in pair], value=value))
    return found


def split(job: Job, limit: int) -> list[Job]:
    """``job``'s rows as jobs of at most ``limit`` examples (its model's max_batch_size), to queue in its
    place: no forward pass takes more than its model's limit, and the parts may share batches with other
    jobs, on any device. Each part answers ``job``: once every part has, with their outputs joined in order
    (``joined_answer``); at a part's failure, with that failure, once (``Job.fail`` withdraws the rest)."""
    examples = job.request.examples
    starts = range(0, examples, limit)
    answers: list[Answer | None] = [None] * len(starts)
    left = [len(starts)]

    def settled(i: int, part: Job, answer: Answer | None, error: BaseException | None) -> None:
        job.device, job.started = job.device or part.device, job.started or part.started
        if error is not None:
            job.fail(error)
            return
        answers[i] = answer
        left[0] -= 1
        if not left[0]:
            job.resolve(joined_answer(answers))

    parts = []
    for i, start in enumerate(starts):
        stop = min(start + limit, examples)
        inputs = {name: sliced(value, start, stop) for name, value in job.inputs.items()}
        # A part keeps no tensor for a next step: the parts' answers are joined as host arrays.
        part = dataclasses.replace(job, request=msgspec.structs.replace(job.request, examples=stop - start),
                                   inputs=inputs, options=dataclasses.replace(job.options, keep=frozenset()),
                                   future=None)
        part.future = Settled(functools.partial(settled, i, part))  # (it names the part: made first)
        parts.append(part)
    job.parts = tuple(parts)
    return parts


def joined_answer(answers: list[Answer]) -> Answer:
    """The answer of a job run as parts (``split``), of its parts' answers in order: their outputs joined by
    rows (host arrays: a part keeps no tensor), and every forward pass they ran, for the statistics."""
    first = answers[0]
    return Answer({name: np.concatenate([answer.outputs[name] for answer in answers]) for name in first.outputs},
                  first.device, first.worker, max(answer.batch_size for answer in answers),
                  min(answer.compute_started for answer in answers), first.batch,
                  tuple(batch for answer in answers[1:] for batch in answer.batches))


def _joined(parts: list, place) -> paddle.Tensor:
    """One tensor on ``place`` of a batch's parts of one input, some of them a step's ``Handed`` tensors:
    the parts that are consecutive rows of one tensor taken as one piece (the whole tensor when they
    are all of it), each piece moved only when it is elsewhere, then joined on ``place``."""
    device = placeenv.device_name(place)
    pieces: list[list] = []  # [tensor, its device, start, stop (None: the whole tensor)]
    for part in parts:
        if isinstance(part, Handed):
            last = pieces[-1] if pieces else None
            if part.rows is not None and last is not None and last[0] is part.tensor and last[3] == part.rows[0]:
                last[3] = part.rows[1]  # the next rows of the same batch's tensor
            else:
                pieces.append([part.tensor, part.device, *(part.rows or (None, None))])
        else:  # a batch-mate's host array (or its preprocess's CPU tensor)
            tensor = request_tensor(part) if isinstance(part, np.ndarray) else part
            pieces.append([tensor, placeenv.device_name(tensor.place), None, None])
    tensors = []
    for tensor, where, start, stop in pieces:
        if start is not None and not (start == 0 and stop == tensor.shape[0]):
            tensor = tensor[start:stop]
        tensors.append(tensor if where == device else move_to(tensor, place))
    return tensors[0] if len(tensors) == 1 else paddle.concat(tensors)

