"""The model repository: scan() of real ``paddle.jit.save`` directories, broken ones, and real services.

* In-process: temporary repositories of small layers saved with ``paddle.jit.save``
  (one and two inputs; FP32, INT64 and BOOL), read by ``repository.scan`` exactly as
  the service reads them at start, then loaded and run on sim devices.
* Broken repositories: each problem is ONE ``RepositoryError`` naming the model, the
  file and the problem (never a traceback), and ``engine.read_repository`` refuses or
  skips as ``on_model_failure`` says.
* Real services (``support.servers.ServiceProcess``, sim devices) on a temporary
  repository: refusing to start (the default) or serving the good models and
  reporting the broken ones not ready (``skip``), and ``instance_group``.

The three service processes start when the module does, so they boot while the
in-process tests run.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import textwrap
import warnings
from pathlib import Path

import httpx
import numpy as np
import paddle
import pytest
from support.models import replica, run, run_locally
from support.servers import ServiceProcess

import placeenv
from placeenv import PlaceEnv
from placeenv.serve.config import Settings
from placeenv.serve.engine.engine import read_repository
from placeenv.serve.engine.dispatch import DeviceQueue
from placeenv.serve.models import Model, RepositoryError, scan
from placeenv.serve.models.base import TensorSpec
from placeenv.serve.engine.workers import WorkerPool

SIM = ("sim:0", "sim:1", "sim:2", "sim:3")


class TwoInputs(paddle.nn.Layer):
    """x FP32 [-1, 4] and ids INT64 [-1, 3] -> (x @ W + b, the ids' sum as float)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(4, 2)

    def forward(self, x, ids):
        return self.fc(x), ids.astype("float32").sum(axis=1, keepdim=True)


class Masked(paddle.nn.Layer):
    """m BOOL [-1, 5] -> m as float times a learned scale (a parameter: jit.save writes .pdiparams)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = self.create_parameter([5], default_initializer=paddle.nn.initializer.Constant(2.0))

    def forward(self, m):
        return m.astype("float32") * self.scale


class Doubled(paddle.nn.Layer):
    """m BOOL [-1, 5] -> m as float, doubled: no parameters, so jit.save writes no .pdiparams."""

    def forward(self, m):
        return m.astype("float32") * 2


class RowSum(paddle.nn.Layer):
    """x FP32 [-1, -1, 3] -> its rows summed, [-1, 3]: a dynamic dimension besides the batch's."""

    def forward(self, x):
        return x.sum(axis=1)


class Upsampled(paddle.nn.Layer):
    """x FP32 [-1, 3, -1, -1] -> twice the size (interpolate by a scale factor): a program Paddle 3.3's
    oneDNN executor builds but cannot run (its scale, a list of doubles), as PP-OCRv5's text detector."""

    def forward(self, x):
        return paddle.nn.functional.interpolate(x, scale_factor=2, mode="nearest")


def _spec(shape, dtype, name=None):
    return paddle.static.InputSpec(shape, dtype, name=name)


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    """Saved programs, by kind: the path prefix ``paddle.jit.save`` wrote (``<dir>/model``)."""
    root = tmp_path_factory.mktemp("programs")
    paddle.seed(0)
    layers = {
        "linear": (paddle.nn.Linear(4, 2), [_spec([None, 4], "float32", "x")]),
        "two": (TwoInputs(), [_spec([None, 4], "float32", "x"), _spec([None, 3], "int64")]),  # unnamed: "ids"
        "masked": (Masked(), [_spec([-1, 5], "bool", "m")]),
        "doubled": (Doubled(), [_spec([-1, 5], "bool", "m")]),
        "fixed": (paddle.nn.Linear(4, 2), [_spec([2, 4], "float32", "x")]),  # no dynamic batch dimension
        "rows": (RowSum(), [_spec([None, None, 3], "float32", "x")]),
        "upsampled": (Upsampled(), [_spec([None, 3, None, None], "float32", "x")]),
    }
    found = {}
    with PlaceEnv("cpu"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "no variable in your model")  # Doubled and others, on purpose
        for kind, (layer, spec) in layers.items():
            layer.eval()
            paddle.jit.save(layer, str(root / kind / "model"), input_spec=spec)
            found[kind] = root / kind / "model"
    assert not found["doubled"].with_suffix(".pdiparams").exists()  # what the parameterless test relies on
    return found


def add(repo: Path, name: str, program: Path | None, *, version: str = "1", stem: str = "model",
        config: str | None = None, config_file: str = "config.yaml", model_py: str | None = None) -> Path:
    """``<repo>/<name>/<version>/`` with a copy of ``program`` (as ``<stem>.json``/``.pdiparams``)."""
    directory = repo / name / version
    directory.mkdir(parents=True, exist_ok=True)
    if program is not None:
        for suffix in (".json", ".pdiparams"):
            if program.with_suffix(suffix).exists():
                shutil.copyfile(program.with_suffix(suffix), (directory / stem).with_suffix(suffix))
    if config is not None:
        (repo / name / config_file).write_text(textwrap.dedent(config))
    if model_py is not None:
        (directory / "model.py").write_text(textwrap.dedent(model_py))
    return directory


def read(*repos: Path, select: list[str] | None = None):
    return scan(list(repos), select, max_batch_size=8, max_batch_delay_ms=2.0)




SIM1_FAILS = """
    from placeenv import device_name
    from placeenv.serve.models import Model as Base


    class Model(Base):
        def initialize(self, place, context):
            if device_name(place) == "sim:1":  # a model that cannot run on one device
                raise RuntimeError("no kernels for this model on sim:1")
            super().initialize(place, context)
"""
BAD_CONFIG = "max_batch_size: lots\n"
ONE_SIM_WORKER = "instance_group:\n  - kind: sim\n    count: 1\n"
GPU_ONLY = "instance_group:\n  - kind: gpu\n    count: 1\n"


# ---------------------------------------------------------------------------------------------
# Real services: launched with the module, checked at its end
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def services(programs, tmp_path_factory):
    """Three services, booting while the in-process tests run:

    skip         linear, grouped (instance_group sim x1) served; broken (bad config), sim1fail
                 (raises on sim:1), nowhere (instance_group gpu only) not ready
    fail_scan    linear + broken + corrupt (model.json garbage): refuses to start
    fail_load    linear + sim1fail + nowhere: refuses to start
    """
    linear = programs["linear"]
    repos = {name: tmp_path_factory.mktemp(name) for name in ("skip", "fail_scan", "fail_load")}
    add(repos["skip"], "linear", linear)
    add(repos["skip"], "grouped", linear, config=ONE_SIM_WORKER)
    add(repos["skip"], "broken", linear, config=BAD_CONFIG)
    add(repos["skip"], "sim1fail", linear, model_py=SIM1_FAILS)
    add(repos["skip"], "nowhere", linear, config=GPU_ONLY)
    add(repos["fail_scan"], "linear", linear)
    add(repos["fail_scan"], "broken", linear, config=BAD_CONFIG)
    (add(repos["fail_scan"], "corrupt", linear) / "model.json").write_text('{"base_code": {"magic": "pir"')
    add(repos["fail_load"], "linear", linear)
    add(repos["fail_load"], "sim1fail", linear, model_py=SIM1_FAILS)
    add(repos["fail_load"], "nowhere", linear, config=GPU_ONLY)
    started = {
        "skip": ServiceProcess(MODEL_REPOSITORY=repos["skip"], MODELS="", ON_MODEL_FAILURE="skip"),
        "fail_scan": ServiceProcess(MODEL_REPOSITORY=repos["fail_scan"], MODELS="", WORKERS_PER_DEVICE=1),
        "fail_load": ServiceProcess(MODEL_REPOSITORY=repos["fail_load"], MODELS="", WORKERS_PER_DEVICE=1),
    }
    yield started
    for proc in started.values():
        try:
            proc.stop(30)
        finally:
            proc.kill()


# ---------------------------------------------------------------------------------------------
# scan(): what a saved program says, and the config file
# ---------------------------------------------------------------------------------------------


def test_a_bare_jit_save_directory_serves_with_what_the_program_says(programs, tmp_path):
    add(tmp_path, "linear", programs["linear"])
    add(tmp_path, "two", programs["two"])
    add(tmp_path, "masked", programs["masked"])
    entries, errors = read(tmp_path)
    assert errors == [] and sorted(entries) == ["linear", "masked", "two"]
    described = {name: entry.describe() for name, entry in entries.items()}
    assert described["linear"]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert described["linear"]["outputs"] == [{"name": "fetch_name_0", "datatype": "FP32", "shape": [-1, 2]}]
    # Two inputs, the second unnamed in its InputSpec (its forward argument names it); two unnamed outputs.
    assert described["two"]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                                          {"name": "ids", "datatype": "INT64", "shape": [-1, 3]}]
    assert described["two"]["outputs"] == [{"name": "fetch_name_0", "datatype": "FP32", "shape": [-1, 2]},
                                           {"name": "fetch_name_1", "datatype": "FP32", "shape": [-1, 1]}]
    assert described["masked"]["inputs"] == [{"name": "m", "datatype": "BOOL", "shape": [-1, 5]}]
    assert described["masked"]["outputs"] == [{"name": "fetch_name_0", "datatype": "FP32", "shape": [-1, 5]}]
    for name, entry in entries.items():
        assert entry.max_batch_size == 8 and entry.max_batch_delay_ms == 2.0  # batchable: the service's
        assert entry.default.model_class is Model and entry.config_file is None
        assert entry.default.program == tmp_path / name / "1" / "model"
        assert described[name]["versions"] == ["1"] and described[name]["description"] == ""


def test_each_saved_program_runs_on_a_sim_device_as_it_does_by_hand(programs, tmp_path):
    add(tmp_path, "two", programs["two"])
    add(tmp_path, "masked", programs["masked"])
    entries, _ = read(tmp_path)
    rng = np.random.default_rng(0)
    x, ids = rng.normal(size=(3, 4)).astype(np.float32), rng.integers(-5, 5, (3, 3))
    mask = rng.integers(0, 2, (3, 5)).astype(bool)
    for device in ("sim:2", "cpu"):
        two = replica(entries["two"], device)
        # backend auto: paddle.jit.load on sim, whose weights the checks see; on the CPU the backend it
        # measured fastest (a Predictor or a runtime), whose weights are in its own scope or session.
        assert two.backend == "jit" if device.startswith("sim:") else two.backend.startswith(
            f"{two.choice['serves']} (backend auto, measured: ")
        assert set(two.parameter_devices().values()) == ({device} if two.backend == "jit" else set())
        out, raw = run(two, {"x": x, "ids": ids})
        assert raw["output"] == {two.output_device()} == {"cpu"}
        expected = run_locally(programs["two"], x, ids)
        np.testing.assert_allclose(out["fetch_name_0"], expected[0], rtol=1e-6)
        np.testing.assert_array_equal(out["fetch_name_1"], ids.sum(axis=1, keepdims=True))
        masked = replica(entries["masked"], device)
        out, _ = run(masked, {"m": mask})
        np.testing.assert_array_equal(out["fetch_name_0"], mask * 2.0)
    assert paddle.get_device() == "sim:0"  # nothing moved this thread


def test_a_program_without_parameters_serves_without_a_pdiparams_file(programs, tmp_path):
    add(tmp_path, "doubled", programs["doubled"])
    entries, errors = read(tmp_path)
    assert errors == [] and not (tmp_path / "doubled" / "1" / "model.pdiparams").exists()
    assert entries["doubled"].describe()["inputs"] == [{"name": "m", "datatype": "BOOL", "shape": [-1, 5]}]
    model = replica(entries["doubled"], "sim:3")
    assert model.parameter_devices() == {}
    mask = np.array([[True, False, True, True, False]])
    out, _ = run(model, {"m": mask})
    np.testing.assert_array_equal(out["fetch_name_0"], mask * 2.0)
    # The negative control: a program WITH parameters and no .pdiparams loads, then fails at its first
    # forward; the repository refuses it at start (test_a_broken_model_..._problem[missing_params]).
    directory = add(tmp_path / "other", "linear", programs["linear"])
    (directory / "model.pdiparams").unlink()
    with PlaceEnv("cpu"):
        layer = paddle.jit.load(str(directory / "model"))
        with pytest.raises(KeyError):
            layer(paddle.ones([1, 4]))


def test_a_fixed_first_dimension_does_not_batch(programs, tmp_path):
    add(tmp_path, "fixed", programs["fixed"])
    entries, errors = read(tmp_path)
    assert errors == [] and entries["fixed"].max_batch_size == 0
    assert entries["fixed"].default.inputs == (TensorSpec("x", "FP32", (2, 4)),)
    (tmp_path / "fixed" / "config.yaml").write_text("max_batch_size: 4\n")
    _, errors = read(tmp_path)
    assert len(errors) == 1 and errors[0].model == "fixed"
    assert errors[0].path == str(tmp_path / "fixed" / "config.yaml")
    assert "max_batch_size 4 needs every input's first dimension dynamic" in errors[0].problem


def test_the_highest_version_is_the_default_and_other_directories_are_not_versions(programs, tmp_path):
    for version in ("1", "2", "10"):
        add(tmp_path, "m", programs["linear"] if version != "10" else programs["two"], version=version)
    (tmp_path / "m" / "config.yaml").write_text("version_policy: {all: {}}\n")
    for ignored in ("0", "abc", "01", ".hidden"):
        (tmp_path / "m" / ignored).mkdir()
    (tmp_path / "m" / "README.md").write_text("notes beside the versions\n")
    entries, errors = read(tmp_path)
    assert errors == []
    entry = entries["m"]
    assert sorted(entry.versions) == [1, 2, 10] and entry.default.number == 10  # 10 > 2: numbers, not names
    assert entry.describe()["versions"] == ["1", "2", "10"]
    assert [s.name for s in entry.default.inputs] == ["x", "ids"]  # the default version's specs
    assert [s.name for s in entry.versions[2].inputs] == ["x"]
    x = np.ones((1, 4), np.float32)
    out, _ = run(replica(entry, "sim:3", version=1), {"x": x})
    np.testing.assert_allclose(out["fetch_name_0"], run_locally(programs["linear"], x)[0], rtol=1e-6)


@pytest.mark.parametrize("policy, served", [
    (None, [10]),  # Triton's default: the latest one
    ("{latest: {num_versions: 2}}", [2, 10]),
    ("{all: {}}", [1, 2, 10]),
    ("{specific: {versions: [2, 1]}}", [1, 2]),
])
def test_the_version_policy_chooses_the_versions_served(programs, tmp_path, policy, served):
    for version in ("1", "2", "10"):
        add(tmp_path, "m", programs["linear"], version=version,
            config=None if policy is None else f"version_policy: {policy}\n")
    entries, errors = read(tmp_path)
    assert errors == [] and sorted(entries["m"].versions) == served


@pytest.mark.parametrize("policy, problem", [
    ("{specific: {versions: [3]}}", "version_policy specific names versions [3], which the repository does not have"),
    ("{latest: {num_versions: 1}, all: {}}", "give exactly one of latest"),
    ("{latest: {num_versions: 0}}", "greater than or equal to 1"),
    ("{all: {x: 1}}", "all takes no settings"),
])
def test_a_version_policy_that_cannot_be_met_is_refused_naming_why(programs, tmp_path, policy, problem):
    add(tmp_path, "m", programs["linear"], config=f"version_policy: {policy}\n")
    entries, errors = read(tmp_path)
    assert "m" not in entries and len(errors) == 1 and problem in str(errors[0]), errors


def test_a_paddlex_export_with_the_inference_prefix_is_a_version_as_it_is(programs, tmp_path):
    directory = add(tmp_path, "exported", programs["linear"], stem="inference")
    (directory / "inference.yml").write_text("Global:\n  model_name: PP-LCNet_x1_0\nPreProcess: {}\n")
    entries, errors = read(tmp_path)
    assert errors == []
    entry = entries["exported"]
    assert entry.default.program == directory / "inference"
    assert entry.describe()["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out, _ = run(replica(entry, "sim:1"), {"x": x})
    np.testing.assert_allclose(out["fetch_name_0"], run_locally(programs["linear"], x)[0], rtol=1e-6)


PADDLEX_YML = """\
Global:
  model_name: PP-Test
Hpi:
  backend_configs:
    paddle_infer:
      trt_dynamic_shapes:
        x:
        - [1, 4]
        - [1, 4]
        - [8, 4]
"""


def test_a_paddlex_export_copied_in_as_it_comes_is_version_1(programs, tmp_path):
    # PaddleX's export: inference.json, inference.pdiparams and inference.yml straight in <model>/.
    directory = tmp_path / "exported"
    add(tmp_path, "exported", programs["linear"], stem="inference")
    for path in (directory / "1").iterdir():
        path.rename(directory / path.name)
    (directory / "1").rmdir()
    (directory / "inference.yml").write_text(PADDLEX_YML)
    entries, errors = read(tmp_path)
    assert errors == []
    entry = entries["exported"]
    assert list(entry.versions) == [1] and entry.default.program == directory / "inference"
    # Outputs take the program's own names, as a Predictor (and PaddleX, and Triton's Paddle backend) call them.
    assert [o["name"] for o in entry.describe()["outputs"]] == ["fetch_name_0"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out, _ = run(replica(entry, "sim:1"), {"x": x})
    np.testing.assert_allclose(out["fetch_name_0"], run_locally(programs["linear"], x)[0], rtol=1e-6)
    # The control: a version directory beside the program is one layout too many, said with both.
    add(tmp_path, "exported", programs["linear"], version="2")
    entries, errors = read(tmp_path)
    assert "exported" not in entries and "keep one layout" in str(errors[0]), errors


def test_an_export_a_directory_too_deep_is_refused_naming_where_it_is(programs, tmp_path):
    add(tmp_path, "ocr_det", programs["linear"], version="PP-OCRv5_mobile_det", stem="inference")
    entries, errors = read(tmp_path)
    problem = str(errors[0])
    assert "ocr_det" not in entries and "inference.json + inference.pdiparams" in problem, errors
    assert "ocr_det/PP-OCRv5_mobile_det/ holds one" in problem and "move its files up into ocr_det/" in problem


def test_every_saved_program_is_warmed_up_by_default_at_its_typical_shape(programs, tmp_path):
    """A version a backend runs gets one request of zeros before ready; dynamic dimensions at the sizes a
    PaddleX export's inference.yml calls typical, else 32; none for a model.py's own forward or where the
    config says warmup: []."""
    add(tmp_path, "plain", programs["rows"])
    exported = add(tmp_path, "exported", programs["rows"], stem="inference")
    (exported / "inference.yml").write_text(PADDLEX_YML.replace("[1, 4]\n        - [1, 4]\n        - [8, 4]",
                                                                "[1, 1, 3]\n        - [2, 7, 3]\n        - [8, 99, 3]"))
    add(tmp_path, "off", programs["rows"], config="warmup: []\n")
    add(tmp_path, "own", programs["rows"], model_py="""
        from placeenv.serve.models import Model as Base

        class Model(Base):
            def execute(self, inputs):
                return {"fetch_name_0": inputs["x"].sum(axis=1)}
    """)
    entries, errors = read(tmp_path)
    assert errors == []
    (label, arrays), = entries["plain"].default.warmup
    assert list(arrays) == ["x"] and arrays["x"].shape == (1, 32, 3) and not arrays["x"].any()
    assert "the default warm-up" in label and "warmup: [] none" in label
    assert entries["exported"].default.warmup[0][1]["x"].shape == (1, 7, 3)
    assert entries["off"].default.warmup == [] and entries["own"].default.warmup == []


def test_a_predictor_that_onednn_cannot_run_is_rebuilt_before_ready_a_step_at_a_time(programs, tmp_path):
    # auto measuring the Predictor alone: the rebuild's steps are the Predictor's.
    add(tmp_path, "up", programs["upsampled"], config="choice: {backends: [inference]}\n")
    add(tmp_path, "unwarmed", programs["upsampled"], config="warmup: []\n")
    entries, errors = read(tmp_path)
    assert errors == []
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    expected = run_locally(programs["upsampled"], x)[0]
    model = replica(entries["up"], "cpu")
    assert model.backend.startswith("inference (oneDNN for its fused convolutions only: with all its kernels the "
                                    "program failed to run: NotImplementedError")
    assert "; backend auto, measured: inference " in model.backend
    assert model.context.inference.onednn and model.context.inference.onednn_ops == "fused"
    out, _ = run(model, {"x": x})
    np.testing.assert_array_equal(out["fetch_name_0"], expected)
    # The next steps, as a program failing again takes them: oneDNN off, then (backend auto) paddle.jit.load.
    assert model.rebuild("RuntimeError: failed again")
    assert model.backend == "inference (oneDNN off: with it the program failed to run: RuntimeError: failed again)"
    assert not model.context.inference.onednn
    np.testing.assert_array_equal(run(model, {"x": x})[0]["fetch_name_0"], expected)
    assert model.rebuild("RuntimeError: and again")
    assert model.backend == "jit (backend auto: Paddle Inference could not run the program: RuntimeError: and again)"
    assert model.predictor is None and model.network is not None
    np.testing.assert_array_equal(run(model, {"x": x})[0]["fetch_name_0"], expected)
    assert not model.rebuild("RuntimeError: once more")  # nothing is left to try
    # The control: without the warm-up the Predictor keeps oneDNN, and the first request finds it cannot run.
    unwarmed = replica(entries["unwarmed"], "cpu")
    assert unwarmed.backend == "inference"
    with pytest.raises(NotImplementedError, match="ConvertPirAttribute2RuntimeAttribute"):
        run(unwarmed, {"x": x})


CONFIGS = {
    "config.yaml": """
        description: two inputs, renamed
        max_batch_size: 0
        max_batch_delay_ms: 5
        instance_group:
          - kind: sim
            count: 1
          - kind: cpu
            count: 2
        inputs:
          - name: features
          - name: token_ids
            datatype: INT32
        outputs:
          - name: scores
          - name: id_sum
            shape: [-1, 1]
        parameters:
          threshold: 0.5
          labels: [cat, dog]
    """,
    "config.toml": """
        description = "two inputs, renamed"
        max_batch_size = 0
        max_batch_delay_ms = 5
        instance_group = [{kind = "sim", count = 1}, {kind = "cpu", count = 2}]
        inputs = [{name = "features"}, {name = "token_ids", datatype = "INT32"}]
        outputs = [{name = "scores"}, {name = "id_sum", shape = [-1, 1]}]

        [parameters]
        threshold = 0.5
        labels = ["cat", "dog"]
    """,
}


@pytest.mark.parametrize("config_file", CONFIGS)
def test_a_config_file_in_yaml_or_toml_is_read_and_applied(programs, tmp_path, config_file):
    add(tmp_path, "two", programs["two"], config=CONFIGS[config_file], config_file=config_file)
    entries, errors = read(tmp_path)
    assert errors == []
    entry = entries["two"]
    assert entry.config_file == tmp_path / "two" / config_file
    assert entry.config.description == "two inputs, renamed"
    assert entry.max_batch_size == 0 and entry.max_batch_delay_ms == 5.0  # 0: never join requests
    assert [(g.kind, g.count) for g in entry.config.instance_group] == [("sim", 1), ("cpu", 2)]
    assert entry.instances("sim:2", 2) == 1 and entry.instances("cpu", 2) == 2
    assert entry.instances("gpu:0", 2) == 0  # a kind not listed: none
    assert entry.instances("cpu", 1) == 1  # never more than the device's workers
    assert entry.default.inputs == (TensorSpec("features", "FP32", (-1, 4)),
                                    TensorSpec("token_ids", "INT32", (-1, 3)))
    assert entry.default.outputs == (TensorSpec("scores", "FP32", (-1, 2)),
                                     TensorSpec("id_sum", "FP32", (-1, 1)))
    context = entry.default.context
    assert dict(context.parameters) == {"threshold": 0.5, "labels": ["cat", "dog"]}
    assert context.inputs == entry.default.inputs and context.program == tmp_path / "two" / "1" / "model"


def test_the_worker_pool_gives_an_instance_group_model_to_one_worker_per_sim_device(programs, tmp_path):
    add(tmp_path, "everywhere", programs["linear"])
    add(tmp_path, "grouped", programs["linear"], config=ONE_SIM_WORKER)
    add(tmp_path, "nowhere", programs["linear"], config=GPU_ONLY)
    entries, _ = read(tmp_path)
    settings = Settings(devices="sim:0,sim:1,cpu", workers_per_device=2)
    queues = {d: DeviceQueue(d, 4, 2) for d in ("sim:0", "sim:1", "cpu")}
    pool = WorkerPool(queues, entries, settings)  # not started: which worker would load what
    held = {w.name: sorted(e.name for e in w.holding.entries) for w in pool.workers}
    assert held == {
        "sim:0/0": ["everywhere", "grouped"], "sim:0/1": ["everywhere"],
        "sim:1/0": ["everywhere", "grouped"], "sim:1/1": ["everywhere"],
        "cpu/0": ["everywhere"], "cpu/1": ["everywhere"],
    }


@pytest.mark.parametrize("config, key", [
    ("max_batch: 4\n", "max_batch"),
    ("description: x\nInstance_group: []\n", "Instance_group"),
    ("instance_group:\n  - kind: sim\n    cnt: 1\n", "instance_group.0.cnt"),
    ("inputs:\n  - name: a\n    dims: [1]\n", "inputs.0.dims"),
])
def test_an_unknown_config_key_is_refused_naming_the_key_and_the_file(programs, tmp_path, config, key):
    add(tmp_path, "m", programs["linear"], config=config)
    add(tmp_path, "good", programs["linear"])
    entries, errors = read(tmp_path)
    assert list(entries) == ["good"] and len(errors) == 1
    error = errors[0]
    assert error.model == "m" and error.path == str(tmp_path / "m" / "config.yaml")
    assert f"{key}: Extra inputs are not permitted" in error.problem
    assert str(error).startswith(f"model 'm': {tmp_path / 'm' / 'config.yaml'}: invalid config: ")


# ---------------------------------------------------------------------------------------------
# Broken repositories: one RepositoryError each, naming the model, the file and the problem
# ---------------------------------------------------------------------------------------------


def _missing_params(repo, programs):
    (add(repo, "m", programs["linear"]) / "model.pdiparams").unlink()
    return "m/1/model.pdiparams", "missing: the saved program's parameters"


def _bad_yaml(repo, programs):
    add(repo, "m", programs["linear"], config="max_batch_size: [1, 2\n")
    return "m/config.yaml", "not readable: ParserError"


def _bad_toml(repo, programs):
    add(repo, "m", programs["linear"], config="max_batch_size = \n", config_file="config.toml")
    return "m/config.toml", "not readable: TOMLDecodeError"


def _yaml_list(repo, programs):
    add(repo, "m", programs["linear"], config="- max_batch_size\n- 4\n")
    return "m/config.yaml", "expected a mapping of settings, got list"


def _wrong_type(repo, programs):
    add(repo, "m", programs["linear"], config=BAD_CONFIG)
    return "m/config.yaml", "invalid config: max_batch_size: Input should be a valid integer"


def _bad_count(repo, programs):
    add(repo, "m", programs["linear"], config="instance_group:\n  - kind: sim\n    count: 0\n")
    return "m/config.yaml", "instance_group.0.count: Input should be greater than or equal to 1"


def _bad_datatype(repo, programs):
    add(repo, "m", programs["linear"], config="inputs:\n  - datatype: FLOAT32\n")
    return "m/config.yaml", "inputs.0.datatype: Input should be 'BOOL', 'UINT8'"


def _two_configs(repo, programs):
    add(repo, "m", programs["linear"], config="description: a\n")
    (repo / "m" / "config.toml").write_text('description = "b"\n')
    return "m", "more than one config file: config.yaml, config.toml"


def _legacy_program(repo, programs):
    directory = add(repo, "m", None)
    (directory / "model.pdmodel").write_bytes(b"\x0a\x02legacy protobuf")
    (directory / "model.pdiparams").write_bytes(b"")
    return "m/1/model.pdmodel", "a legacy (pre-PIR) program"


def _corrupt_program(repo, programs):
    (add(repo, "m", programs["linear"]) / "model.json").write_text('{"base_code": {"magic": "pir"')
    return "m/1/model.json", "paddle.jit.load failed"


def _syntax_error(repo, programs):
    add(repo, "m", programs["linear"],
        model_py="from placeenv.serve.models import Model\n\nclass Model(Model)\n")
    return "m/1/model.py:3", "import failed: SyntaxError"


def _raises_at_import(repo, programs):
    add(repo, "m", programs["linear"], model_py="import os\n\nraise RuntimeError('no licence key found')\n")
    return "m/1/model.py:3", "import failed: RuntimeError: no licence key found"


def _imports_what_is_not_there(repo, programs):
    add(repo, "m", programs["linear"], model_py="import placeenv_no_such_module\n")
    return "m/1/model.py:1", "import failed: ModuleNotFoundError: No module named 'placeenv_no_such_module'"


def _no_model_class(repo, programs):
    add(repo, "m", programs["linear"], model_py="class Network:\n    pass\n")
    return "m/1/model.py", "defines no class Model(placeenv.serve.models.Model)"


def _model_not_a_subclass(repo, programs):
    add(repo, "m", programs["linear"],
        model_py="class Model:\n    def execute(self, inputs):\n        return inputs\n")
    return "m/1/model.py", "defines no class Model(placeenv.serve.models.Model)"


def _model_py_without_specs(repo, programs):
    add(repo, "m", None,
        model_py="from placeenv.serve.models import Model as Base\n\nclass Model(Base):\n    pass\n")
    return "m/1/model.py", "no inputs: declare them in model.py or the config file"


def _version_zero(repo, programs):
    add(repo, "m", programs["linear"], version="0")
    return "m", ("no saved program: expected PaddleX's export as it comes, <model>/inference.json + "
                 "inference.pdiparams (version 1), or version directories, <model>/1/inference.json")


def _version_abc(repo, programs):
    add(repo, "m", programs["linear"], version="abc")
    return "m", "m/abc/ holds one, but a version directory is named by a positive integer (1, 2, ...)"


def _no_versions(repo, programs):
    (repo / "m").mkdir()
    (repo / "m" / "config.yaml").write_text("description: nothing saved yet\n")
    return "m", "no saved program: expected PaddleX's export as it comes"


def _empty_version(repo, programs):
    add(repo, "m", None)
    return "m/1", "no saved program: expected inference.json + inference.pdiparams (a PaddleX export), " \
                  "model.json + model.pdiparams"


def _bad_name(repo, programs):
    add(repo, "m m", programs["linear"])
    return "m m", "a model name is letters, digits"


def _too_many_overrides(repo, programs):
    add(repo, "m", programs["linear"], config="outputs:\n  - name: a\n  - name: b\n")
    return "m/1", "the config overrides 2 outputs; the model has 1"


def _rank_override(repo, programs):
    add(repo, "m", programs["linear"], config="inputs:\n  - shape: [-1, 2, 2]\n")
    return "m/1", "inputs[0] shape [-1, 2, 2] has another rank than the program's [-1, 4]"


def _padding_unknown_input(repo, programs):
    add(repo, "m", programs["linear"], config="batch_padding:\n  y: {dims: [1]}\n")
    return "m/config.yaml", "batch_padding: no input 'y' (version 1); the inputs are x"


def _padding_static_dim(repo, programs):
    add(repo, "m", programs["linear"], config="batch_padding:\n  x: {dims: [1]}\n")
    return "m/config.yaml", ("batch_padding: input 'x' (shape [-1, 4]): dim 1 is not a dynamic (-1) dimension after "
                             "the batch dimension 0; write dims: [] (none: the input cannot be padded; remove it)")


def _padding_batch_dim(repo, programs):
    add(repo, "m", None, config="batch_padding:\n  x: {dims: [0]}\n", model_py=WIDE_ROWS)
    return "m/config.yaml", "dim 0 is not a dynamic (-1) dimension after the batch dimension 0; write dims: [1]"


def _padding_not_batching(repo, programs):
    add(repo, "m", None, config="max_batch_size: 0\nbatch_padding:\n  x: {dims: [1]}\n", model_py=WIDE_ROWS)
    return "m/config.yaml", "batch_padding: the model does not batch (max_batch_size 0)"


WIDE_ROWS = """
    from placeenv.serve.models import Model as Base, TensorSpec


    class Model(Base):
        inputs = (TensorSpec("x", "FP32", (-1, -1)),)
        outputs = (TensorSpec("y", "FP32", (-1, -1)),)
"""


def test_batch_padding_is_read_into_each_versions_context(tmp_path):
    add(tmp_path, "m", None, config="batch_padding:\n  x: {dims: [1], value: -1.5}\n", model_py=WIDE_ROWS)
    entries, errors = read(tmp_path)
    assert errors == [] and dict(entries["m"].default.context.padding) == {"x": ((1,), -1.5)}


BROKEN = {f.__name__.lstrip("_"): f for f in [
    _missing_params, _bad_yaml, _bad_toml, _yaml_list, _wrong_type, _bad_count, _bad_datatype, _two_configs,
    _legacy_program, _corrupt_program, _syntax_error, _raises_at_import, _imports_what_is_not_there,
    _no_model_class, _model_not_a_subclass, _model_py_without_specs, _version_zero, _version_abc,
    _no_versions, _empty_version, _bad_name, _too_many_overrides, _rank_override, _padding_unknown_input,
    _padding_static_dim, _padding_batch_dim, _padding_not_batching,
]}


@pytest.mark.parametrize("make", BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_model_is_one_error_naming_the_model_the_file_and_the_problem(programs, tmp_path, make):
    add(tmp_path, "good", programs["linear"])
    file, problem = make(tmp_path, programs)
    entries, errors = read(tmp_path)
    assert list(entries) == ["good"], "the rest of the repository still loads"
    assert len(errors) == 1, errors
    error = errors[0]
    name = "m m" if file.startswith("m m") else "m"
    assert isinstance(error, RepositoryError) and error.model == name
    assert error.path == str(tmp_path / file), error
    assert problem in error.problem, error
    assert str(error) == f"model {name!r}: {tmp_path / file}: {error.problem}"
    # Not a traceback: no chained exception, no frames in the message.
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert "Traceback" not in str(error) and "File \"" not in str(error)


def test_the_same_model_name_in_two_repositories_is_refused(programs, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    add(first, "m", programs["linear"])
    add(second, "m", programs["two"])
    add(second, "other", programs["linear"])
    entries, errors = read(first, second)
    assert sorted(entries) == ["m", "other"] and entries["m"].directory == first / "m"  # the first one
    assert len(errors) == 1 and errors[0].model == "m" and errors[0].path == str(second / "m")
    assert f"also in {first}: model names must be unique across repositories" in errors[0].problem


def test_a_selected_model_not_in_the_repository_is_refused_naming_what_is_there(programs, tmp_path):
    add(tmp_path, "linear", programs["linear"])
    add(tmp_path, "two", programs["two"])
    with pytest.raises(RepositoryError) as caught:
        read(tmp_path, select=["linear", "resnet", "bert"])
    error = caught.value
    assert error.model == "resnet, bert" and error.path == str(tmp_path)
    assert "not in the repository (PLACEENV_MODELS); it holds: linear, two" in error.problem
    entries, errors = read(tmp_path, select=["two"])  # the control: a selection that is there
    assert list(entries) == ["two"] and errors == []


def test_a_repository_that_is_not_a_directory_is_refused(tmp_path):
    with pytest.raises(RepositoryError, match=r"no such directory \(PLACEENV_MODEL_REPOSITORY\)") as caught:
        read(tmp_path / "missing")
    assert caught.value.path == str(tmp_path / "missing")


def test_read_repository_refuses_by_default_and_skips_when_asked(programs, tmp_path):
    add(tmp_path, "good", programs["linear"])
    _wrong_type(tmp_path, programs)
    (add(tmp_path, "corrupt", programs["linear"]) / "model.json").write_text("not json")
    settings = {"model_repository": str(tmp_path), "models": "", "devices": "sim:0"}
    with pytest.raises(RuntimeError) as caught:
        read_repository(Settings(**settings))
    message = str(caught.value)
    assert message.startswith("model repository: ") and message.endswith(
        "(PLACEENV_ON_MODEL_FAILURE=skip serves the rest)")
    assert f"model 'm': {tmp_path / 'm' / 'config.yaml'}: invalid config" in message
    assert f"model 'corrupt': {tmp_path / 'corrupt' / '1' / 'model.json'}: paddle.jit.load failed" in message
    found, skipped = read_repository(Settings(**settings, on_model_failure="skip"))
    assert list(found.entries) == ["good"] and found.pipelines == {} and sorted(skipped) == ["corrupt", "m"]
    assert "config.yaml" in skipped["m"] and "model.json" in skipped["corrupt"]
    with pytest.raises(RuntimeError, match="it holds: corrupt, good, m"):
        read_repository(Settings(**{**settings, "models": "good,resnet"}, on_model_failure="skip"))


def test_a_model_that_fails_on_one_device_fails_there_only(programs, tmp_path):
    add(tmp_path, "sim1fail", programs["linear"], model_py=SIM1_FAILS)
    entries, errors = read(tmp_path)
    assert errors == []
    assert entries["sim1fail"].default.model_class.__module__ == "placeenv_repository.sim1fail.v1"
    with pytest.raises(RuntimeError, match="no kernels for this model on sim:1"):
        replica(entries["sim1fail"], "sim:1")
    assert set(replica(entries["sim1fail"], "sim:2").parameter_devices().values()) == {"sim:2"}


# ---------------------------------------------------------------------------------------------
# Real services
# ---------------------------------------------------------------------------------------------


def exited(proc: ServiceProcess) -> tuple[int, str]:
    try:
        code = proc.proc.wait(120)
    except Exception:
        proc.kill()
        raise
    return code, proc.output()


def one_line_refusal(output: str) -> None:
    """A refusal is logged once, as our one-line message, with no traceback: middleware.QuietStartupFailure
    keeps Starlette from repeating a StartupError as its formatted traceback."""
    assert "Traceback" not in output and 'File "' not in output, output[-4000:]
    assert output.count("cannot start: ") == 1, output[-4000:]


def test_by_default_a_broken_repository_stops_the_service_naming_each_model_and_file(services):
    code, output = exited(services["fail_scan"])
    assert code != 0, output[-3000:]
    repo = re.search(r"model 'broken': (\S+)/broken/config\.yaml: invalid config: max_batch_size", output)
    assert repo, output[-3000:]
    assert f"model 'corrupt': {repo[1]}/corrupt/1/model.json: paddle.jit.load failed" in output
    assert "PLACEENV_ON_MODEL_FAILURE=skip serves the rest" in output
    assert "Application startup failed" in output and "Uvicorn running" not in output
    one_line_refusal(output)


def test_by_default_a_model_that_fails_on_a_device_or_fits_none_stops_the_service(services):
    code, output = exited(services["fail_load"])
    assert code != 0, output[-3000:]
    assert ("model 'sim1fail' did not load on sim:1 (worker sim:1/0): RuntimeError: no kernels for this model on sim:1"
            in output), output[-3000:]
    assert "model 'nowhere': no worker loads it (instance_group kinds ['gpu'], devices sim:0, sim:1" in output
    assert "Uvicorn running" not in output
    one_line_refusal(output)


@pytest.fixture(scope="module")
def skipping(services):
    return services["skip"].wait_ready()


def test_skip_serves_the_good_models_and_reports_the_others_not_ready(skipping, programs):
    url = skipping.url
    listed = httpx.get(url + "/v1/models", timeout=10).json()
    assert sorted(m["name"] for m in listed["models"]) == ["grouped", "linear"]
    not_ready = listed["not_ready"]
    assert sorted(not_ready) == ["broken", "nowhere", "sim1fail"]
    assert re.search(r"/broken/config\.yaml: invalid config: max_batch_size", not_ready["broken"])
    assert "did not load on sim:1 (worker sim:1/0): RuntimeError: no kernels for this model on sim:1" in not_ready["sim1fail"]
    assert "no worker loads it (instance_group kinds ['gpu']" in not_ready["nowhere"]

    for name in ("linear", "grouped"):
        r = httpx.get(f"{url}/v2/models/{name}/ready", timeout=10)
        assert r.status_code == 200 and r.json()["ready"] is True
    for name in ("broken", "sim1fail", "nowhere"):
        r = httpx.get(f"{url}/v2/models/{name}/ready", timeout=10)
        assert r.status_code == 503 and "Retry-After" in r.headers, r.text
        assert f"model {name!r} is not ready" in r.json()["error"]
    assert httpx.get(f"{url}/v2/models/resnet/ready", timeout=10).status_code == 404  # the control

    index = {row["name"]: row for row in httpx.post(url + "/v2/repository/index", timeout=10).json()}
    assert index["linear"]["state"] == index["grouped"]["state"] == "READY"
    for name in ("broken", "sim1fail", "nowhere"):
        assert index[name]["state"] == "UNAVAILABLE" and index[name]["reason"] == not_ready[name][:300]

    r = httpx.post(url + "/predict", json={"model": "broken", "inputs": [[0, 0, 0, 0]]}, timeout=10)
    assert r.status_code == 503 and "failed to load at start" in r.json()["detail"]
    infer = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": list(range(8))}]}
    r = httpx.post(url + "/v2/models/sim1fail/infer", json=infer, timeout=10)
    assert r.status_code == 503 and "not ready" in r.json()["error"]

    r = httpx.post(url + "/v2/models/linear/infer", json=infer, timeout=10)
    assert r.status_code == 200, r.text
    (output,) = r.json()["outputs"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert output["name"] == "fetch_name_0" and output["shape"] == [2, 2]
    np.testing.assert_allclose(np.reshape(output["data"], (2, 2)), run_locally(programs["linear"], x)[0],
                               rtol=1e-5)
    assert skipping.proc.poll() is None
    assert "Traceback" not in skipping.output()  # each failure is one logged line, no traceback


def test_an_instance_group_model_runs_only_on_the_workers_it_names(skipping):
    # grouped: instance_group [{kind: sim, count: 1}], so worker <device>/0 of each sim device loads
    # it and <device>/1 does not. linear (every worker) is the control: /1 workers do serve.
    workers = httpx.get(skipping.url + "/readyz", timeout=10).json()["workers"]
    assert sorted(workers) == sorted(f"{d}/{i}" for d in SIM for i in (0, 1)) and all(workers.values())
    seen: dict[str, set[str]] = {"grouped": set(), "linear": set()}

    async def main():
        async with httpx.AsyncClient(base_url=skipping.url, timeout=30) as client:
            async def one(model: str, i: int):
                r = await client.post("/predict", json={"model": model, "inputs": [[i, 1, 2, 3]]})
                assert r.status_code == 200, r.text
                seen[model].add(r.json()["worker"])

            for _ in range(30):  # bounded: until the control has reached a /1 worker
                await asyncio.gather(*(one(m, i) for i in range(12) for m in ("grouped", "linear")))
                if any(w.endswith("/1") for w in seen["linear"]):
                    break

    asyncio.run(main())
    assert seen["grouped"] and all(w.endswith("/0") for w in seen["grouped"]), seen
    assert {w.split("/")[0] for w in seen["grouped"]} <= set(SIM)
    assert any(w.endswith("/1") for w in seen["linear"]), seen  # the control
    up = skipping.by_label("worker_up", "worker")
    assert sorted(up) == sorted(workers)  # every worker, /1 included, is up: they just do not hold grouped
