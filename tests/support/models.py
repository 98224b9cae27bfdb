"""Repository models run as the service runs them: one worker's replica, and the workers' own forward
pass (``engine/forward.py``'s ``forward``, through ``engine/standalone.py``), so a test checks a
model against the code that serves it; and the reference it is checked against: a saved program
run by hand on the CPU (``run_locally``), digits' with its pre- and post-processing written out
(``digits_locally``)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import paddle

import placeenv
from placeenv import PlaceEnv
from placeenv.serve.engine import standalone
from placeenv.serve.models import BUNDLED, Model, scan
from placeenv.serve.models.train_digits import PIXEL_MAX, held_out_split

#: The held-out digits (x, y), split once a process when a test first asks: the split imports scikit-learn,
#: which collecting the modules that use it does not need.
held_out = functools.cache(held_out_split)


def replica(entry, device: str, version: int | None = None) -> Model:
    """One worker's replica of a repository ``entry`` (its default version unless named) on ``device``."""
    return standalone.replica(entry, placeenv.to_place(device), version)


def replica_of(repository: Path, name: str, device: str, max_batch_size: int = 8) -> Model:
    """``replica`` of model ``name`` of ``repository``."""
    entries, errors = scan([repository], [name], max_batch_size=max_batch_size, max_batch_delay_ms=0)
    assert not errors, errors
    return replica(entries[name], device)


def run(model: Model, inputs: dict) -> tuple[dict, dict[str, set[str]]]:
    """What the service does with one request: the postprocessed host arrays, and the devices the
    worker's place checks saw at each stage ("output": where the forward's raw outputs were)."""
    seen: dict[str, set[str]] = {}

    def check(stage: str, actual: str, expected: str | None = None) -> bool:
        seen.setdefault(stage, set()).add(actual)
        return True

    return standalone.forward(model, inputs, check=check), seen


@functools.cache
def program(prefix: str):
    """The saved program at ``prefix``, loaded by hand with ``paddle.jit.load`` on the CPU (once)."""
    with PlaceEnv("cpu"):
        layer = paddle.jit.load(prefix)
    layer.eval()
    return layer


@PlaceEnv("cpu")
def run_locally(prefix: Path, *arrays: np.ndarray) -> list[np.ndarray]:
    """The saved program at ``prefix`` run by hand on the CPU: what every replica must agree with."""
    with paddle.no_grad():
        out = program(str(prefix))(*[paddle.to_tensor(a) for a in arrays])
    return [t.numpy() for t in (out if isinstance(out, (list, tuple)) else [out])]


def digits_locally(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(labels, probabilities): digits' saved program with its model.py's pre/post, written out here."""
    (logits,) = run_locally(BUNDLED / "digits" / "1" / "model", (pixels / PIXEL_MAX).astype(np.float32))
    exp = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    probabilities = exp / exp.sum(axis=1, keepdims=True)
    return probabilities.argmax(axis=1), probabilities


class TwoKinds(paddle.nn.Layer):
    """Two inputs of different datatypes, a dynamic sequence length, two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = paddle.nn.Embedding(50, 8)
        self.linear = paddle.nn.Linear(8, 3)

    def forward(self, features, ids):
        mixed = self.embedding(ids).mean(axis=1) + features
        return self.linear(mixed), ids.sum(axis=1)


TWO_KINDS_SPEC = [paddle.static.InputSpec([None, 8], "float32", "features"),
                  paddle.static.InputSpec([None, None], "int64", "ids")]


class Convs(paddle.nn.Layer):
    """x FP32 [-1, 3, -1, -1] -> three 3x3 convolutions of 32 channels: a run long enough to watch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 32, 3, padding=1), paddle.nn.ReLU(),
                                        paddle.nn.Conv2D(32, 32, 3, padding=1), paddle.nn.ReLU(),
                                        paddle.nn.Conv2D(32, 32, 3, padding=1))

    def forward(self, x):
        return self.net(x)


def hammer(replicas: list, inputs: list[dict], output: str = "fetch_name_0") -> None:
    """Each replica in a thread of its own, all running ``inputs`` at once: every answer that of the first
    replica alone; an exception in a thread fails the caller."""
    import threading

    expected = [run(replicas[0], one)[0][output] for one in inputs]
    found: dict[int, list] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(replicas))

    def loop(index: int) -> None:
        try:
            start.wait()
            found[index] = [run(replicas[index], one)[0][output] for one in inputs]
        except BaseException as exc:  # noqa: BLE001 - the caller fails on it below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(replicas))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for answers in found.values():
        for got, want in zip(answers, expected):
            np.testing.assert_array_equal(got, want)


def device_workers(entry, count: int = 2) -> list:
    """``count`` replicas of ``entry``'s default version on the CPU sharing one DeviceShare, as a device's
    workers make them, each warmed up."""
    from placeenv.serve.engine.replica import replica_context, warm_up
    from placeenv.serve.models.backends import DeviceShare

    version, share = entry.default, DeviceShare()
    replicas = []
    for _ in range(count):
        replica = version.model_class()
        replica.initialize(paddle.CPUPlace(), replica_context(entry, version, share=share))
        warm_up(replica, entry, version)
        replicas.append(replica)
    return replicas
