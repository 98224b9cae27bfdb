"""One copy of each model version's weights per device, shared by the device's workers.

A real service on one sim device, ``--workers-per-device`` 1 or 4: ``device_memory_used_bytes``
stays at one copy, where ``share_weights: false`` (the negative control) holds one a worker.
Under concurrent load every answer is compared with a replica of its own, and the place checks
find nothing.
"""

from __future__ import annotations

import shutil
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import paddle
import pytest
from support.models import replica, run
from support.servers import ServiceProcess

from placeenv import PlaceEnv
from placeenv.serve.models import scan
from placeenv.serve.models.backends import adopt_weights

COPY = (256 * 1024 + 1024 + 1024 * 256 + 256) * 4  # bytes of Wide's parameters
DEVICE = "sim:1"


class Wide(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.net = paddle.nn.Sequential(paddle.nn.Linear(256, 1024), paddle.nn.ReLU(), paddle.nn.Linear(1024, 256))

    def forward(self, x):
        return self.net(x)


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """``wide`` (jit on sim, as auto picks there), ``wide-inference``, ``wide-own`` (no sharing), and
    ``wide-doubled``, whose model.py doubles its weights in place after loading them."""
    root = tmp_path_factory.mktemp("repository")
    paddle.seed(1)
    with PlaceEnv("cpu"):
        paddle.jit.save(Wide(), str(root / "wide" / "1" / "model"),
                        input_spec=[paddle.static.InputSpec([None, 256], "float32", "x")])
    for name, config in (("wide-inference", "backend: inference\n"), ("wide-own", "share_weights: false\n"),
                         ("wide-doubled", "")):
        shutil.copytree(root / "wide", root / name)
        (root / name / "config.yaml").write_text(config)
    (root / "wide-doubled" / "1" / "model.py").write_text(textwrap.dedent("""
        import paddle
        from placeenv.serve.models import Model as Base

        class Model(Base):
            def initialize(self, place, context):
                super().initialize(place, context)
                with paddle.no_grad():
                    for parameter in self.network.parameters():
                        parameter.set_value(parameter * 2)  # once per replica: its own copy, or wrong
    """))
    return root


def device_memory(proc: ServiceProcess) -> float:
    return proc.total("device_memory_used_bytes", device=DEVICE)


def serve(repository: Path, model: str, workers: int) -> ServiceProcess:
    return ServiceProcess(DEVICES=DEVICE, WORKERS_PER_DEVICE=workers, MODEL_REPOSITORY=str(repository),
                          MODELS=model, MAX_BATCH_SIZE=4)


def hammer(proc: ServiceProcess, repository: Path, model: str) -> None:
    """Concurrent requests; every answer that of a replica of the model's own, no leak."""
    entries, errors = scan([repository], [model], max_batch_size=4, max_batch_delay_ms=0)
    assert not errors
    reference = replica(entries[model], "cpu")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1 + i % 3, 256)).astype(np.float32) for i in range(96)]

    def one(x: np.ndarray) -> np.ndarray:
        body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        answer = httpx.post(f"{proc.url}/v2/models/{model}/infer", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        (out,) = answer.json()["outputs"]
        return np.asarray(out["data"], np.float32).reshape(out["shape"])

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, inputs))
    for x, got in zip(inputs, answers):
        (want,) = run(reference, {"x": x})[0].values()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert proc.by_label("placeenv_device_leaks_total", "stage") == {}
    assert proc.total("placeenv_place_checks_total", device=DEVICE) > 0


@pytest.mark.parametrize("model", ["wide", "wide-inference"])
def test_the_workers_of_a_device_hold_one_copy_of_the_weights(repository, model):
    with serve(repository, model, 1) as proc:
        one_worker = device_memory(proc)
    assert one_worker >= COPY  # the weights are on the device, counted
    with serve(repository, model, 4) as proc:
        config = httpx.get(f"{proc.url}/v2/models/{model}/config", timeout=10).json()
        # The default (shared, as the defaults load it) is unset: not among Triton's parameters.
        assert "share_weights" not in config["parameters"] and "backend" in config["parameters"]
        four_workers = device_memory(proc)
        hammer(proc, repository, model)
        after_load = device_memory(proc)
    # One copy: four workers hold what one does, within a quarter of a copy of allocator slack.
    assert four_workers <= one_worker + COPY / 4, (one_worker, four_workers)
    assert after_load <= one_worker + COPY / 4, (one_worker, after_load)


def test_negative_control_without_sharing_each_worker_holds_a_copy(repository):
    with serve(repository, "wide", 1) as proc:
        one_worker = device_memory(proc)
    with serve(repository, "wide-own", 4) as proc:
        four_workers = device_memory(proc)
        hammer(proc, repository, "wide-own")
    assert four_workers >= one_worker + 3 * COPY * 0.95, (one_worker, four_workers)


def test_a_model_py_that_changes_its_weights_at_initialize_keeps_a_copy_a_worker(repository):
    """Shared, the fourth worker would double weights already doubled three times: by default a
    model.py that overrides initialize() or load() is not shared, and every answer is right."""
    with serve(repository, "wide-doubled", 4) as proc:
        hammer(proc, repository, "wide-doubled")
        four_workers = device_memory(proc)
    assert four_workers >= 4 * COPY * 0.95


def test_adopting_weights_takes_the_same_tensors_or_refuses_a_different_network():
    paddle.seed(2)
    first, second, other = Wide(), Wide(), paddle.nn.Linear(256, 256)
    x = paddle.randn([2, 256])
    assert adopt_weights(second, first)
    assert all(a is b for a, b in zip(second.parameters(), first.parameters()))
    np.testing.assert_array_equal(second(x).numpy(), first(x).numpy())
    before = [p.numpy() for p in other.parameters()]
    assert not adopt_weights(other, first)
    assert all((p.numpy() == b).all() for p, b in zip(other.parameters(), before))
