"""The workers of a CPU device each run a Predictor of their own, whose runs leave the GIL
(placeenv.native), side by side: every answer under concurrent runs that of one replica run alone. The
negative controls take turns on one Predictor under one lock: runs that hold the GIL (switched off), and
a config that asks to share the weights."""

from __future__ import annotations

import shutil

import numpy as np
import paddle
import pytest
from support.models import device_workers, hammer as support_hammer

from placeenv import PlaceEnv, native
from placeenv.serve.models import scan


class Convs(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3, padding=1), paddle.nn.ReLU(),
                                        paddle.nn.Conv2D(8, 4, 3, padding=1))

    def forward(self, x):
        return self.net(x)


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    """``convs`` (the defaults) and ``convs-shared`` (``share_weights: true``), Predictors both."""
    root = tmp_path_factory.mktemp("repository")
    paddle.seed(3)
    with PlaceEnv("cpu"):
        layer = Convs()
        layer.eval()
        paddle.jit.save(layer, str(root / "convs" / "1" / "model"),
                        input_spec=[paddle.static.InputSpec([None, 3, 24, 24], "float32", "x")])
    shutil.copytree(root / "convs", root / "convs-shared")
    (root / "convs" / "config.yaml").write_text("backend: inference\n")
    (root / "convs-shared" / "config.yaml").write_text("backend: inference\nshare_weights: true\n")
    found, errors = scan([root], ["convs", "convs-shared"], max_batch_size=4, max_batch_delay_ms=0)
    assert not errors, errors
    return found


@pytest.fixture
def switched_off(monkeypatch):
    monkeypatch.setenv(native.SWITCH, "0")
    native._found.cache_clear()  # what the process decided at its first Predictor
    yield
    monkeypatch.undo()
    native._found.cache_clear()


def hammer(replicas: list) -> None:
    """Each replica in a thread of its own, runs at once: every answer that of the first replica alone."""
    rng = np.random.default_rng(0)
    support_hammer(replicas, [{"x": rng.standard_normal((1 + i % 4, 3, 24, 24)).astype(np.float32)}
                              for i in range(24)])


def test_a_cpu_devices_workers_run_predictors_of_their_own_side_by_side_and_answer_alike(entries):
    first, second = device_workers(entries["convs"])
    assert first.backend == second.backend == "inference"
    assert first.predictor is not second.predictor and first._run_lock is not second._run_lock
    assert not first.shares_weights and not second.shares_weights
    hammer([first, second])
    assert all(replica._native_run[1] is not None for replica in (first, second))  # ran without the GIL


def test_negative_control_a_config_that_shares_the_weights_takes_turns_on_one_predictor(entries):
    first, second = device_workers(entries["convs-shared"])
    assert first.predictor is second.predictor and first._run_lock is second._run_lock and second.shares_weights
    hammer([first, second])


def test_negative_control_runs_that_hold_the_gil_share_one_predictor_in_turns(entries, switched_off):
    assert native.unavailable() == f"turned off ({native.SWITCH}=0)"
    first, second = device_workers(entries["convs"])
    assert first.predictor is second.predictor and first._run_lock is second._run_lock
    hammer([first, second])
    assert first._native_run[1] is None and second._native_run[1] is None  # the binding's run
