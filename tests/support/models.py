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
from placeenv.serve.models.train_digits import PIXEL_MAX


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
