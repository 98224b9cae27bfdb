"""Paddle Inference as a model's backend: a Predictor per worker, its answers those of
``paddle.jit.load``, the config's ``backend`` (``auto``, ``jit``, ``inference``) and its errors.

In process: replicas made as a worker makes them (``engine.standalone``), on the CPU and a sim device.
Over HTTP: one service whose repository holds a model of each backend, under concurrent load.
"""

from __future__ import annotations

import json
import logging
import shutil
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import paddle
import pytest
from support.models import TwoKinds, replica_of, run
from support.servers import ServiceProcess

import placeenv
from placeenv import PlaceEnv
from placeenv.serve.config import Settings
from placeenv.serve.engine import standalone
from placeenv.serve.models import inference, scan
from placeenv.serve.models.repository import BUNDLED
from placeenv.serve.models.examples import ensure_mobilenet, mobilenet_home
from placeenv.serve.engine.dispatch import DeviceQueue
from placeenv.serve.engine.workers import WorkerPool

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """``two`` (TwoKinds) three times, one per backend, in one repository."""
    root = tmp_path_factory.mktemp("repository")
    paddle.seed(0)
    layer = TwoKinds()
    layer.eval()
    spec = [paddle.static.InputSpec([None, 8], "float32", "features"), paddle.static.InputSpec([None, None], "int64", "ids")]
    with PlaceEnv("cpu"):
        paddle.jit.save(layer, str(root / "two-auto" / "1" / "model"), input_spec=spec)
    for backend in ("jit", "inference"):
        shutil.copytree(root / "two-auto", root / f"two-{backend}")
        (root / f"two-{backend}" / "config.yaml").write_text(f"backend: {backend}\n")
    # auto measuring the Predictor alone: a Predictor on the CPU, paddle.jit.load on sim.
    shutil.copytree(root / "two-auto", root / "two-predictor")
    (root / "two-predictor" / "config.yaml").write_text("backend: auto\nchoice: {backends: [inference]}\n")
    return root


def two_inputs(rows: int, length: int) -> dict[str, np.ndarray]:
    return {"features": RNG.random((rows, 8), dtype=np.float32),
            "ids": RNG.integers(0, 50, (rows, length)).astype(np.int64)}


def v2_body(inputs: dict[str, np.ndarray]) -> dict:
    return {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32" if a.dtype == np.float32 else "INT64",
                        "data": a.ravel().tolist()} for n, a in inputs.items()]}


def test_each_backend_answers_as_jit_load_with_two_inputs_of_two_datatypes(repository):
    jit = replica_of(repository, "two-jit", "cpu")
    predictor = replica_of(repository, "two-inference", "cpu")
    assert (jit.backend, predictor.backend) == ("jit", "inference")
    assert predictor.predictor is not None and predictor.network is None  # the control: jit's is a Layer
    for rows, length in ((1, 1), (4, 7), (3, 30)):  # the sequence length changes between calls
        inputs = two_inputs(rows, length)
        want, _ = run(jit, inputs)
        got, raw = run(predictor, inputs)
        assert list(got) == ["fetch_name_0", "fetch_name_1"] or list(got) == list(want), got.keys()
        np.testing.assert_allclose(got[list(got)[0]], want[list(want)[0]], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[list(got)[1]], want[list(want)[1]])
        assert got[list(got)[1]].dtype == np.int64
        assert raw["output"] == {"cpu"}


def test_auto_measures_on_the_cpu_and_takes_jit_load_on_a_sim_device(repository):
    on_cpu = replica_of(repository, "two-auto", "cpu")
    assert on_cpu.choice is not None and on_cpu.backend.startswith(f"{on_cpu.choice['serves']} (backend auto")
    on_sim = replica_of(repository, "two-auto", "sim:1")
    assert on_sim.backend == "jit" and on_sim.network is not None
    forced = replica_of(repository, "two-inference", "sim:1")  # asked for: a Predictor on the custom device
    assert forced.backend == "inference"
    inputs = two_inputs(2, 5)
    want, _ = run(on_sim, inputs)
    got, _ = run(forced, inputs)
    for (name, a), b in zip(want.items(), got.values()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=name)


def test_auto_runs_a_predictor_on_a_gpu_only_as_the_process_one_accelerator():
    # A Predictor's run holds the GIL while its device works (benchmarks/gil_probe.py): several devices'
    # Predictors would take turns, so auto gives them paddle.jit.load, whose forward does not.
    assert inference.chosen("auto", "gpu:0", accelerators=1) == "inference"
    assert inference.chosen("auto", "gpu:1", accelerators=2) == "jit"
    assert "this process serves 2 accelerators" in inference.why_jit("gpu:1", 2)
    assert inference.chosen("auto", "cpu", accelerators=8) == "inference"
    assert inference.chosen("auto", "sim:0", accelerators=1) == "jit" and inference.why_jit("sim:0", 4) is None
    assert inference.chosen("inference", "gpu:0", accelerators=8) == "inference"  # asked for, it is kept


def test_the_pool_counts_the_accelerators_it_serves(repository):
    entries, errors = scan([repository], ["two-auto"], max_batch_size=8, max_batch_delay_ms=0)
    assert not errors
    queues = {d: DeviceQueue(d, 4, 2) for d in ("sim:0", "sim:1", "cpu")}
    pool = WorkerPool(queues, entries, Settings(workers_per_device=2))
    # The CPU does not count: a Predictor there is the fast path whatever the count.
    assert pool.accelerators == 2
    assert {w.holding.slot.accelerators for w in pool.workers} == {2}


@pytest.mark.parametrize("name", ["digits", "mobilenet"])
def test_the_bundled_models_answer_alike_on_both_backends(name, tmp_path):
    ensure_mobilenet()
    source = BUNDLED / name
    for backend in ("jit", "inference"):
        target = tmp_path / backend / name
        shutil.copytree((mobilenet_home() if name == "mobilenet" else source) / "1", target / "1")
        (target / "config.yaml").write_text(f"backend: {backend}\n")
    jit, predictor = (replica_of(tmp_path / backend, name, "cpu") for backend in ("jit", "inference"))
    assert (jit.backend, predictor.backend) == ("jit", "inference")
    (spec,) = jit.context.inputs
    inputs = {spec.name: RNG.random((4, *spec.shape[1:]), dtype=np.float32) * (16 if name == "digits" else 1)}
    want, _ = run(jit, inputs)
    got, _ = run(predictor, inputs)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-4, err_msg=key)


def test_a_program_the_predictor_cannot_load_is_a_named_error_or_with_auto_falls_back(repository, tmp_path, caplog):
    # Read by scan() (paddle.jit.load, for the program's signature), then spoiled before the workers load
    # it: the Predictor refuses it, and so does paddle.jit.load, so that with auto the error that stays
    # is jit.load's own, after the fallback was said.
    entries = {}
    for backend in ("inference", "auto"):
        shutil.copytree(repository / "two-jit", tmp_path / backend)
        (tmp_path / backend / "config.yaml").write_text(f"backend: {backend}\n")
        found, errors = scan([tmp_path], [backend], max_batch_size=8, max_batch_delay_ms=0)
        assert not errors, errors
        entries[backend] = found[backend]
        with (tmp_path / backend / "1" / "model.pdiparams").open("ab") as params:
            params.write(b"not parameters")
    cpu = placeenv.to_place("cpu")
    with pytest.raises(RuntimeError, match=r"Paddle Inference cannot load the program \(backend: inference\)"):
        standalone.replica(entries["inference"], cpu)
    with caplog.at_level(logging.WARNING), pytest.raises(Exception) as jit_error:
        standalone.replica(entries["auto"], cpu)
    assert "Paddle Inference could not load the program" in caplog.text
    assert "serving it with paddle.jit.load" in caplog.text
    assert "Paddle Inference" not in str(jit_error.value)


def test_backend_inference_needs_a_saved_program_it_can_run(repository, tmp_path):
    entry = tmp_path / "custom"
    shutil.copytree(repository / "two-jit", entry)
    (entry / "config.yaml").write_text("backend: inference\n")
    (entry / "1" / "model.py").write_text(textwrap.dedent("""
        from placeenv.serve.models import Model as Base

        class Model(Base):
            def load(self, context):  # its own network: a Predictor cannot run it
                return super().load(context)
    """))
    entries, errors = scan([tmp_path], ["custom"], max_batch_size=8, max_batch_delay_ms=0)
    assert not entries and "backend inference runs the version's saved program" in str(errors[0])
    (entry / "config.yaml").write_text("backend: inference\ninference: {onednn: maybe}\n")
    entries, errors = scan([tmp_path], ["custom"], max_batch_size=8, max_batch_delay_ms=0)
    assert not entries and "inference.onednn" in str(errors[0])


def test_a_service_serves_every_backend_under_concurrent_load_and_says_which(repository):
    with ServiceProcess(DEVICES="cpu", WORKERS_PER_DEVICE=2, MODEL_REPOSITORY=str(repository),
                        MODELS="two-auto,two-jit,two-inference") as proc:
        requests = [(name, two_inputs(1 + i % 3, 1 + i % 9))
                    for i in range(64) for name in ("two-auto", "two-jit", "two-inference")][:64 * 3]
        reference = replica_of(repository, "two-jit", "cpu")

        def one(request) -> tuple[str, dict, dict]:
            name, inputs = request
            answer = httpx.post(f"{proc.url}/v2/models/{name}/infer", json=v2_body(inputs), timeout=60)
            assert answer.status_code == 200, answer.text
            return name, inputs, {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in answer.json()["outputs"]}

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, requests))
        for name, inputs, outputs in answers:
            want, _ = run(reference, inputs)
            for key, value in want.items():
                np.testing.assert_allclose(outputs[key], value, rtol=1e-5, atol=1e-5, err_msg=f"{name} {key}")
        backends = {name: httpx.get(f"{proc.url}/v2/models/{name}/config", timeout=10).json()
                    for name in ("two-auto", "two-jit", "two-inference")}
    # Triton's ModelConfig has no field for them: they are in its parameters, as JSON (protocol/triton.py).
    found = {n: (c["parameters"]["backend"]["string_value"], json.loads(c["parameters"]["backends"]["string_value"]))
             for n, c in backends.items()}
    measured = json.loads(backends["two-auto"]["parameters"]["backend_choice"]["string_value"])["cpu"]["serves"]
    assert found.pop("two-auto")[1]["cpu"].startswith(f"{measured} (backend auto, measured: ")
    assert found == {"two-jit": ("jit", {"cpu": "jit"}), "two-inference": ("inference", {"cpu": "inference"})}


@pytest.mark.parametrize("isolation", ["on", "off"])
def test_a_predictor_workers_place_checks_catch_a_leak_only_without_isolation(repository, isolation):
    # two-predictor runs as a Predictor on the CPU's workers and as a jit.load layer on sim:0's. With
    # isolation off (stock Paddle: one process-wide device, each worker calling set_device before
    # its batch), a sim worker's set_device lands under a CPU worker: the CPU worker's checks of its
    # thread's device before and after the Predictor's run count the leak. With isolation on, none.
    with ServiceProcess(DEVICES="cpu,sim:0", WORKERS_PER_DEVICE=2, MODEL_REPOSITORY=str(repository),
                        MODELS="two-predictor", ISOLATION=isolation) as proc:
        config = httpx.get(f"{proc.url}/v2/models/two-predictor/config", timeout=10).json()
        backends = json.loads(config["parameters"]["backends"]["string_value"])
        assert backends["sim:0"] == "jit" and backends["cpu"].startswith("inference (backend auto"), backends

        def one(i: int) -> int:
            body = v2_body(two_inputs(1 + i % 4, 1 + i % 7))
            return httpx.post(f"{proc.url}/v2/models/two-predictor/infer", json=body, timeout=60).status_code

        def cpu_leaks() -> float:
            return sum(n for worker, n in proc.by_label("placeenv_device_leaks_total", "worker").items()
                       if worker.startswith("cpu/"))

        # (Without isolation the warm-up may have leaked already: what counts is what grows under the traffic.)
        before = cpu_leaks()
        # 400 requests, 16 in flight, in rounds of 50; the control's run ends at the round where its CPU
        # workers counted a leak (what it shows is that they do).
        codes = []
        with ThreadPoolExecutor(16) as pool:
            while len(codes) < 400 and not (isolation == "off" and cpu_leaks() > before):
                codes += pool.map(one, range(len(codes), len(codes) + 50))
        grown = cpu_leaks() - before
        leaks = proc.by_label("placeenv_device_leaks_total", "worker")
        checks = proc.by_label("placeenv_place_checks_total", "stage")
    assert checks.get("execute", 0) > 0
    if isolation == "on":
        assert codes == [200] * 400 and leaks == {}, leaks
    else:  # the negative control: the Predictor's workers see the device move under them
        assert grown > 0, (len(codes), leaks)


def test_a_model_py_that_overrides_execute_keeps_jit_load_under_auto_and_may_opt_in(repository, tmp_path):
    # Written against self.network, such a model.py keeps paddle.jit.load under auto; with backend:
    # inference its execute() wraps the default one, which runs the Predictor.
    shutil.copytree(repository / "two-auto", tmp_path / "scaled")
    (tmp_path / "scaled" / "1" / "model.py").write_text(textwrap.dedent("""
        from placeenv.serve.models import Model as Base

        class Model(Base):
            def execute(self, inputs):
                outputs = super().execute(inputs)
                return {**outputs, "fetch_name_0": outputs["fetch_name_0"] * 2}
    """))
    plain = replica_of(repository, "two-jit", "cpu")
    inputs = two_inputs(3, 4)
    want, _ = run(plain, inputs)
    for config, device, backend in (("auto", "cpu", "jit"), ("inference", "cpu", "inference"), ("auto", "sim:2", "jit")):
        (tmp_path / "scaled" / "config.yaml").write_text(f"backend: {config}\n")
        scaled = replica_of(tmp_path, "scaled", device)
        assert scaled.backend == backend
        got, _ = run(scaled, inputs)
        np.testing.assert_allclose(got["fetch_name_0"], want["fetch_name_0"] * 2, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got["fetch_name_1"], want["fetch_name_1"])
