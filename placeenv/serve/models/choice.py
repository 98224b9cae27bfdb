"""``backend: auto`` measures: at load, once for a version on a device, each backend that can run the export is
timed on the version's warm-up inputs, and the fastest whose outputs agree with Paddle's serves.

Paddle's outputs are the reference: a Predictor's (with oneDNN as the config says, else its fused convolutions
only, else without it: the steps a failing Predictor is rebuilt through), or ``paddle.jit.load``'s where no
Predictor runs the program. A runtime (ONNX Runtime, OpenVINO: models/runtimes.py) is compared with it on random
inputs of the warm-up inputs' shapes (a warm-up of zeros says little of the weights) and, for a model that
batches, of the batch it serves, every output within the config's ``choice`` tolerances; one that differs,
cannot convert or cannot run is passed over, and why is kept. Those runs are each backend's first timed
round: a backend whose first run of a shape builds what its next runs reuse (a Predictor with oneDNN or on
a GPU, ``paddle.jit.load``'s program, OpenVINO, ONNX Runtime on a GPU) runs the warm-up inputs and their
batch once before, untimed. The backends still in are timed in interleaved rounds (the median of each) on
the random inputs, one measurement at a time in the process, so that two devices' workers loading at once
do not time each other; after the first round, one more than ``HOPELESS`` times slower than the fastest is
not timed again, and where one alone is left, none is.

A choice is kept in the conversion cache, under the digest of all it depends on (the export's bytes, its
converted file, the options, the samples' shapes, the packages' versions, the device, the machine's
processor and cores): the next start builds only what serves, in the time and memory of a backend named in
the config.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import os
import platform
import threading
import time
from typing import Any

import numpy as np
import paddle

from placeenv import PlaceEnv
from placeenv.tensors import JIT_LOAD_LOCK, host_tensor

from . import inference, runtimes
from .inference import InferenceOptions

#: One measurement at a time in the process: timings taken while another device's workers measure are noise.
MEASURING = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Choice:
    """What ``auto`` chose for a version on a device: the backend that serves, each timed backend's median
    milliseconds over the warm-up inputs, why each other was passed over, the Predictor options that ran the
    program (None where none did), and the session of a runtime that serves."""

    serves: str
    timings_ms: dict[str, float]
    passed_over: dict[str, str]
    inference: InferenceOptions | None
    session: runtimes.Session | None = None
    #: How the Predictor came to run the program where the config's options did not, as a rebuild says it.
    note: str | None = None
    measured_at: str = ""  # when (UTC, ISO 8601): a choice read from the cache keeps its measurement's
    cached: bool = False  # read from the cache: nothing was built or timed but what serves

    def describe(self) -> dict[str, Any]:
        """What ``/v2/models/{m}/config`` and the statistics say of it."""
        found = {"serves": self.serves, "timings_ms": dict(self.timings_ms), "passed_over": dict(self.passed_over),
                 "measured_at": self.measured_at, "cached": self.cached}
        if self.note:
            found["inference"] = self.note
        return found

    def summary(self) -> str:
        """``Model.backend``: the backend, and how it was chosen."""
        times = ", ".join(f"{name} {ms:.1f} ms" for name, ms in sorted(self.timings_ms.items(), key=lambda i: i[1]))
        over = "; ".join(f"{name}: {why}" for name, why in self.passed_over.items())
        how = f"{self.note}; " if self.note and self.serves == "inference" else ""
        return f"{self.serves} ({how}backend auto, measured: {times}{'; passed over: ' + over if over else ''})"


def measure(program, place, device: str, context, samples: list[list[np.ndarray]]) -> Choice:
    """Choose the backend of the saved program at ``program`` on ``device`` (``place``) from ``context``'s
    config, on ``samples`` (each the program's inputs in its order, host arrays): the choice kept for the same
    export, converted file, options, samples, packages and machine where there is one, else measured now
    and kept."""
    key = _key(program, device, context, samples)
    found = _cached(key, program, device, context)
    if found is not None:
        return found
    found = _measure(program, place, device, context, samples)
    _keep(key, found)
    return found


def _key(program, device: str, context, samples: list[list[np.ndarray]]) -> str:
    """What a measurement depends on, as a digest: the export's digest (its bytes), its converted file's
    size and modification time (a file replaced is measured again), the options, the samples' shapes, the
    packages' versions, the device and the machine's processor and cores."""
    digest = hashlib.sha256(runtimes.export_digest(program).encode())
    try:
        converted = runtimes.onnx_file(program).stat()
        digest.update(f"converted {converted.st_size} {converted.st_mtime_ns}".encode())
    except Exception as exc:  # noqa: BLE001 - a conversion that fails is part of what was measured
        digest.update(f"no conversion: {exc}".encode())
    digest.update(json.dumps({
        "device": device, "max_batch_size": context.max_batch_size,
        "options": [context.inference.model_dump(mode="json"), context.runtime.model_dump(mode="json"),
                    context.choice.model_dump(mode="json")],
        "samples": [[[list(a.shape), str(a.dtype)] for a in arrays] for arrays in samples],
        "packages": {name: runtimes._version(name) for name in ("paddlepaddle", "onnxruntime", "openvino",
                                                                 "paddle2onnx")},
        "machine": [platform.machine(), _processor(), runtimes.default_threads()],
    }, sort_keys=True).encode())
    return digest.hexdigest()[:24]


@functools.cache
def _processor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def _path(key: str):
    return runtimes.cache_root("PLACEENV_ONNX_CACHE", "onnx") / "choices" / f"{key}.json"


def _cached(key: str, program, device: str, context) -> Choice | None:
    """The kept choice of ``key``, its runtime's session opened; None where there is none (or it no longer
    opens: it is measured again)."""
    try:
        kept = json.loads(_path(key).read_text(encoding="utf-8"))
        session = (runtimes.open_session(kept["serves"], program, device, context.runtime)
                   if kept["serves"] in runtimes.RUNTIMES else None)
        options = InferenceOptions.model_validate(kept["inference"]) if kept["inference"] is not None else None
        return Choice(kept["serves"], kept["timings_ms"], kept["passed_over"], options, session, kept["note"],
                      kept["measured_at"], cached=True)
    except Exception:  # noqa: BLE001 - none kept, or one that cannot serve: measured again
        return None


def _keep(key: str, found: Choice) -> None:
    """Keep ``found`` for the next start (written beside and renamed: a reader never sees half of it)."""
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_text(json.dumps({
            "serves": found.serves, "timings_ms": found.timings_ms, "passed_over": found.passed_over,
            "inference": found.inference.model_dump(mode="json") if found.inference is not None else None,
            "note": found.note, "measured_at": found.measured_at}), encoding="utf-8")
        os.replace(partial, path)
    except OSError:  # a read-only cache: the next start measures again
        pass


def _measure(program, place, device: str, context, samples: list[list[np.ndarray]]) -> Choice:
    settings = context.choice
    wanted = list(settings.backends or ("inference", *runtimes.RUNTIMES))
    passed: dict[str, str] = {}
    runs: dict[str, Any] = {}
    first: dict[str, float] = {}  # each timed backend's first round: its runs compared with the reference's
    shapes = samples + _batched(samples, context.max_batch_size)
    timed = [_random_like(arrays) for arrays in shapes]
    with MEASURING:
        # A Predictor's first run of a shape builds oneDNN's primitives on the CPU, and on a GPU cuDNN's
        # choices (TensorRT's engine): it runs on zeros first, untimed. Without oneDNN it builds nothing.
        builds = context.inference.onednn or device != "cpu"
        predictor, options, problem, note, answered, took = _predictor(
            program, place, context.inference, (shapes if builds else timed)[0])
        if predictor is not None:
            reference_name, reference = "inference", _predictor_call(predictor)
        else:
            passed["inference"] = f"Paddle Inference cannot run the program: {problem}"
            reference_name, reference, builds = "jit", _jit_call(program, place), True
        if builds:  # each shape once, untimed: the Predictor has run the first
            for arrays in shapes[1:] if predictor is not None else shapes:
                reference(arrays)
            expected, took = _timed_run(reference, timed)
        else:  # the Predictor's run on the first random inputs is the first of the round
            rest, more = _timed_run(reference, timed[1:])
            expected, took = [answered, *rest], took + more
        if reference_name in wanted or reference_name == "jit":
            runs[reference_name], first[reference_name] = reference, took
        sessions: dict[str, runtimes.Session] = {}
        for name in runtimes.RUNTIMES:
            if name not in wanted:
                passed[name] = "not among the config's choice.backends"
                continue
            why = runtimes.unavailable(name, device)
            if why is None:
                try:
                    session = runtimes.open_session(name, program, device, context.runtime)
                    run = session.runner()
                    if session.builds_per_shape():
                        for arrays in shapes:
                            run(arrays)
                    found, took = _timed_run(run, timed)
                    why = disagreement(found, expected, settings.rtol, settings.atol, reference_name)
                except Exception as exc:  # noqa: BLE001 - the reason it is passed over
                    why = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
            if why is None:
                runs[name], sessions[name], first[name] = run, session, took
            else:
                passed[name] = why
        timings = _timed(runs, timed, settings.rounds, first)
    serves = min(timings, key=timings.get)
    measured_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return Choice(serves, timings, passed, options, sessions.get(serves), note, measured_at)


def disagreement(found: list[list[np.ndarray]], expected: list[list[np.ndarray]], rtol: float, atol: float,
                 reference: str) -> str | None:
    """Why outputs ``found`` (a list per input) do not agree with ``expected``; None where they do."""
    for got, want in zip(found, expected):
        if len(got) != len(want):
            return f"it answers {len(got)} outputs, {reference} {len(want)}"
        for i, (a, b) in enumerate(zip(got, want)):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                return f"its output {i} has shape {list(a.shape)}, {reference}'s {list(b.shape)}"
            if not _close(a, b, rtol, atol):
                worst = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                return (f"its output {i} differs from {reference}'s by up to {worst:.3g} (choice tolerances: "
                        f"rtol {rtol:g}, atol {atol:g})")
    return None


#: Elements compared at once: np.allclose makes several temporaries of its inputs' size, and a recogniser's
#: logits at its batch are millions of values, each temporary a block the heap returns and faults in anew.
CLOSE_CHUNK = 1 << 16


def _close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> bool:
    """``np.allclose(a, b)`` (NaNs equal) of two arrays of one shape, a chunk at a time."""
    a, b = a.reshape(-1), b.reshape(-1)
    return all(np.allclose(a[i:i + CLOSE_CHUNK], b[i:i + CLOSE_CHUNK], rtol=rtol, atol=atol, equal_nan=True)
               for i in range(0, a.size, CLOSE_CHUNK))


def _predictor(program, place, options: InferenceOptions, arrays: list[np.ndarray]):
    """A Predictor that runs ``arrays``, with ``options`` or the rebuild's next steps (oneDNN's fused
    convolutions only, then oneDNN off): (predictor, its options, None, how it came to them in a rebuild's
    words or None, its outputs on ``arrays``, the milliseconds that run took), or (None, None, the last
    problem, None, None, 0)."""
    steps = [(options, None)]
    if options.onednn and options.onednn_ops == "all":
        steps.append((options.model_copy(update={"onednn_ops": "fused"}),
                      "oneDNN for its fused convolutions only: with all its kernels"))
    if options.onednn:
        steps.append((options.model_copy(update={"onednn": False}), "oneDNN off: with it"))
    problem = ""
    for step, how in steps:
        try:
            with JIT_LOAD_LOCK:
                predictor = inference.create(program, place, step)
            answered, took = _timed_run(_predictor_call(predictor), [arrays])
            return predictor, step, None, how and f"{how} the program failed to run: {problem}", answered[0], took
        except Exception as exc:  # noqa: BLE001 - the next step, or the reason none ran
            problem = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    return None, None, problem, None, None, 0.0


def _predictor_call(predictor):
    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [tensor.numpy() for tensor in predictor.run([host_tensor(a) for a in arrays])]

    return run


def _jit_call(program, place):
    with JIT_LOAD_LOCK, PlaceEnv(place):
        layer = paddle.jit.load(str(program))
    layer.eval()

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        with PlaceEnv(place), paddle.no_grad():
            out = layer(*[paddle.to_tensor(a) for a in arrays])
        return [t.numpy() for t in (out if isinstance(out, (list, tuple)) else [out])]

    return run


def _random_like(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The same inputs with their floating-point values drawn from a standard normal distribution, the scale
    of normalised images and features (integers and booleans kept: they may be indices or masks)."""
    rng = np.random.default_rng(0)
    return [rng.standard_normal(a.shape).astype(a.dtype) if np.issubdtype(a.dtype, np.floating) else a
            for a in arrays]


#: The largest batch auto times a batching model at: its max_batch_size, or this where that is larger, and no
#: more examples than make ``TIMED_ELEMENTS`` input values (a detector's pages: a load stays seconds).
TIMED_BATCH = 8
TIMED_ELEMENTS = 1 << 22


def _batched(samples: list[list[np.ndarray]], max_batch_size: int) -> list[list[np.ndarray]]:
    """A batching model's samples repeated to the batch it serves (within ``TIMED_BATCH`` and
    ``TIMED_ELEMENTS``): a runtime that wins at one example may lose at six (PP-OCRv5's recogniser: ONNX
    Runtime at 1, OpenVINO 2.4x its throughput at 6)."""
    found = []
    for arrays in samples:
        rows = arrays[0].shape[0] if arrays and arrays[0].ndim else 0
        each = sum(a.size for a in arrays) // max(rows, 1)
        batch = min(max_batch_size, TIMED_BATCH, TIMED_ELEMENTS // max(each, 1))
        if batch > 1 and 0 < rows < batch:
            found.append([np.concatenate([a] * -(-batch // rows))[:batch] for a in arrays])
    return found


#: After the first round, a backend slower than this many times the fastest is not timed again: it cannot win,
#: and its rounds are most of a load's time (PP-OCRv5's detector: the Predictor's 0.9 s against 0.2 s).
HOPELESS = 2.0


def _timed_run(run, inputs: list[list[np.ndarray]]) -> tuple[list[list[np.ndarray]], float]:
    """``run``'s outputs on each of ``inputs``, and the milliseconds its runs took in all."""
    found, took = [], 0.0
    for arrays in inputs:
        start = time.perf_counter()
        found.append(run(arrays))
        took += time.perf_counter() - start
    return found, took * 1000


def _timed(runs: dict[str, Any], inputs: list[list[np.ndarray]], rounds: int,
           first: dict[str, float]) -> dict[str, float]:
    """Each run's median milliseconds over ``inputs``, in ``rounds`` interleaved rounds, ``first`` the
    first's (one only for a run ``HOPELESS`` times slower than the fastest's first; none more where one
    alone is left: nothing is left to choose)."""
    found: dict[str, list[float]] = {name: [first[name]] for name in runs}
    fastest = min(first[name] for name in runs)
    left = {name: run for name, run in runs.items() if first[name] <= HOPELESS * fastest}
    for _ in range(rounds - 1 if len(left) > 1 else 0):
        for name, run in left.items():
            found[name].append(_timed_run(run, inputs)[1])
    return {name: round(float(np.median(times)), 2) for name, times in found.items()}
