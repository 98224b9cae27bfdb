"""The bundled repository's models and the model contract, in-process, on CPU and on sim devices.

Each replica is built as a worker builds it: ``version.model_class()`` then
``initialize(place, context)`` (``paddle.jit.load`` of the saved program), and a
request goes the worker's way: ``preprocess`` (host arrays, under PlaceEnv('cpu'))
-> ``host_tensor`` -> ``move_to`` the replica's place -> ``execute`` -> ``postprocess``.
Invalid inputs go the service's way: ``wire.from_json`` (JSON to an array),
``TensorSpec.check`` (datatype and shape), then the model's ``preprocess``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import paddle
import pytest
from support import run_threads, where
from support.bundled import ENTRIES, ERRORS, checked, template
from support.models import replica, run
from support.servers import TEST_REPOSITORY

import placeenv
from placeenv import PlaceEnv
from placeenv.serve import metrics
from placeenv.serve.protocol.errors import InvalidInput
from placeenv.serve.models import BUNDLED, InputError, Model, RepositoryError, scan
from placeenv.serve.models import examples as bundled
from placeenv.serve.models.base import host_tensor, move_to
from placeenv.serve.models.train_digits import PIXEL_MAX, held_out_split
from placeenv.serve.engine.batch import PlaceChecker


@pytest.fixture(scope="module")
def held_out():
    x, y = held_out_split()
    return x, y


# ---- the bundled repository ----


#: The bundled models: the two examples, and the steps of the two pipelines (tests/service/models/
#: test_bundled_pipelines.py serves those).
BUNDLED_MODELS = ["classify_decode", "classify_topk", "digits", "mobilenet", "ocr_decode", "ocr_det", "ocr_read",
                  "ocr_rec"]


def test_bundled_repository_serves_digits_and_mobilenet_and_describes_them():
    assert ERRORS == [] and sorted(ENTRIES) == BUNDLED_MODELS
    described = {e.name: e.describe() for e in ENTRIES.values()}
    assert json.loads(json.dumps(described, allow_nan=False)) == described
    digits, mobilenet = described["digits"], described["mobilenet"]
    assert digits["versions"] == ["1"] and digits["max_batch_size"] == 8
    assert digits["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    assert digits["outputs"] == [{"name": "label", "datatype": "INT64", "shape": [-1]},
                                 {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]
    # A plain jit.save directory: names, dtypes and shapes all come from the saved program.
    assert mobilenet["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert mobilenet["outputs"] == [{"name": "fetch_name_0", "datatype": "FP32", "shape": [-1, 10]}]
    assert "random weights" in mobilenet["description"].lower()
    assert ENTRIES["mobilenet"].default.model_class is Model  # no model.py: the defaults serve it
    assert ENTRIES["digits"].default.model_class.__module__ == "placeenv_repository.digits.v1"
    assert ENTRIES["digits"].config.parameters == {"pixel_max": 16}


@pytest.mark.parametrize("name", ["resnet", "../digits", "digits/1", "placeenv.serve.models.digits",
                                  "Digits"])
def test_a_model_not_in_the_repository_is_refused_naming_what_it_holds(name):
    with pytest.raises(RepositoryError) as caught:
        scan([BUNDLED], [name], max_batch_size=8, max_batch_delay_ms=2.0)
    message = str(caught.value)
    assert name in message and "PLACEENV_MODELS" in message
    assert f"it holds: {', '.join(sorted([*BUNDLED_MODELS, 'classify', 'ocr']))}" in message


# ---- digits: accuracy and placement ----


def test_digits_held_out_accuracy_on_cpu(held_out):
    x, y = held_out
    outputs, _ = run(replica(ENTRIES["digits"], "cpu"), {"pixels": x})
    assert (outputs["label"] == y).mean() >= 0.95
    assert outputs["label"].dtype == np.int64 and outputs["probabilities"].shape == (len(x), 10)
    np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1, atol=1e-6)
    assert (outputs["label"] == outputs["probabilities"].argmax(axis=1)).all()


def test_digits_on_sim1_keeps_its_weights_there_and_matches_the_program_run_locally(held_out):
    x, _ = held_out
    model = replica(ENTRIES["digits"], "sim:1")
    assert set(model.parameter_devices().values()) == {"sim:1"}
    assert {where(v) for v in model.network.state_dict().values()} == {"sim:1"}
    outputs, raw = run(model, {"pixels": x})
    # The sim exception: a saved program runs on CPU-fallback kernels and returns CPU tensors.
    assert model.output_device() == "cpu" and raw["output"] == {"cpu"}
    assert paddle.get_device() == "sim:0"  # the forward did not move this thread
    with PlaceEnv("cpu"):  # the reference: the same program, loaded and run by hand
        program = paddle.jit.load(str(ENTRIES["digits"].default.program))
        logits = program(paddle.to_tensor(x / PIXEL_MAX)).numpy()
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(outputs["probabilities"], expected / expected.sum(axis=1, keepdims=True),
                               atol=1e-5)
    cpu, _ = run(replica(ENTRIES["digits"], "cpu"), {"pixels": x})
    np.testing.assert_array_equal(outputs["label"], cpu["label"])


def test_replicas_built_in_threads_land_on_their_own_devices(held_out):
    x = held_out[0][:32]
    results = {}

    def worker(device):
        paddle.set_device("sim:0")  # the thread's default differs from the replica's place
        model = replica(ENTRIES["digits"], device)
        results[device] = (set(model.parameter_devices().values()), run(model, {"pixels": x})[0])

    run_threads(*(lambda d=d: worker(d) for d in ("sim:1", "sim:2", "sim:3")))
    reference, _ = run(replica(ENTRIES["digits"], "cpu"), {"pixels": x})
    for device, (places, outputs) in results.items():
        assert places == {device}
        np.testing.assert_array_equal(outputs["label"], reference["label"])
        np.testing.assert_allclose(outputs["probabilities"], reference["probabilities"], atol=1e-5)


def test_the_place_checker_counts_a_batch_on_another_device_as_a_leak():
    # Model.execute does not check where its inputs are; the worker's place checks do.
    model = replica(ENTRIES["digits"], "sim:1")
    check = PlaceChecker("test-worker", "sim:1")
    labels = {"worker": "test-worker", "expected": "sim:1", "actual": "cpu", "stage": "batch"}

    def leaks() -> float:  # the counter's sample with these labels, as a scrape reads it (0 before the first)
        return sum(sample.value for family in metrics.DEVICE_LEAKS.collect() for sample in family.samples
                   if sample.name == "placeenv_device_leaks_total" and sample.labels == labels)

    before = leaks()
    on_cpu = host_tensor(np.zeros((1, 64), np.float32))
    assert check("batch", where(move_to(on_cpu, model.place))) is True
    assert leaks() == before
    assert check("batch", where(on_cpu)) is False  # still on the CPU: a leak, counted with its labels
    assert leaks() == before + 1


# ---- preprocess ----


def test_preprocess_is_host_arrays_in_a_sim2_thread_and_leaves_the_thread_there(held_out):
    x = held_out[0][:3]
    model = template("digits")
    found = {}

    def worker():
        paddle.set_device("sim:2")
        assert where(paddle.ones([1])) == "sim:2"  # the thread really is on sim:2
        with PlaceEnv("cpu"):  # the service's preprocessing scope (engine.Engine._preprocess)
            out = model.preprocess({"pixels": x})
            found["tensor"] = host_tensor(out["pixels"])
        found["out"] = out
        found["after"] = paddle.ones([1])

    run_threads(worker)
    assert isinstance(found["out"]["pixels"], np.ndarray) and found["out"]["pixels"].shape == (3, 64)
    np.testing.assert_allclose(found["out"]["pixels"], x / 16, rtol=1e-6)
    assert where(found["tensor"]) == "cpu"
    assert where(found["after"]) == "sim:2"  # the CPU scope did not leak out


GOOD = [0] * 64
BAD_INPUTS = {
    "not a list": ({"pixels": GOOD}, "data must be a list of values, got dict"),
    "empty": ([], "input 'pixels' has shape [0]; expected [-1, 64]"),
    "bare example": (GOOD, "input 'pixels' has shape [64]; expected [-1, 64]"),
    "short": ([GOOD, [0] * 63], "tensor 'pixels' is ragged"),
    "8x8 (not taken)": ([[[0] * 8] * 8], "input 'pixels' has shape [1, 8, 8]; expected [-1, 64]"),
    "too deep": ([[[[0]] * 8] * 8], "input 'pixels' has shape [1, 8, 8, 1]"),
    "absurdly deep": ([[[[[[[[[[0]]]]]]]]]], "is nested too deep"),
    "string": ([GOOD[:5] + ["abc"] + GOOD[6:]],
               "(FP32) has the value 'abc' at position [0, 5]; expected numbers"),
    "numeric string": ([["1"] * 64], "has the value '1' at position [0, 0]"),
    "None example": ([GOOD, None], "tensor 'pixels' is ragged"),
    "None value": ([GOOD[:63] + [None]], "has the value None at position [0, 63]"),
    "bool": ([[True] * 64], "has the value True at position [0, 0]"),
    "dict value": ([[{"a": 1}] * 64], "has the value {'a': 1} at position [0, 0]"),
    "long string": ([["x" * 5000] * 64], "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (5002 characters)"),
    "NaN": ([GOOD[:9] + [float("nan")] + GOOD[10:]], "input 'pixels' has value nan at position [0, 9]"),
    "Inf": ([GOOD, GOOD[:10] + [float("inf")] + GOOD[11:]], "has value inf at position [1, 10]"),
    "-Inf": ([[float("-inf")] * 64], "has value -inf at position [0, 0]"),
    "float32 overflow": ([[1e39] * 64], "has value inf at position [0, 0]"),
    "17": ([GOOD[:3] + [17] + GOOD[4:]], "has value 17 at position [0, 3]; expected pixels in [0, 16]"),
    "negative": ([[-0.5] * 64], "has value -0.5 at position [0, 0]; expected pixels in [0, 16]"),
    "huge int": ([[10**400] * 64], "tensor 'pixels' has an integer too large for FP32"),
    "ragged depth": ([[[0, 1], 2]], "tensor 'pixels' is ragged"),
}


@pytest.mark.parametrize("inputs, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_invalid_inputs_are_refused_naming_the_problem(inputs, message):
    with pytest.raises((InvalidInput, InputError)) as caught:
        checked("digits", inputs)
    assert message in str(caught.value)
    assert len(str(caught.value)) < 200  # a prefix of what was sent, never all of it


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_values_are_refused_whatever_range_the_config_sets(value):
    model = template("digits")
    context = model.context
    model.context = dataclasses.replace(context, parameters={"pixel_max": 255})
    wide = model.preprocess({"pixels": np.full((1, 64), 200, np.float32)})["pixels"]
    np.testing.assert_allclose(wide, 200 / 255, rtol=1e-6)  # the config's range is what preprocess uses
    with pytest.raises(InputError, match=f"has value {value} at position"):
        model.preprocess({"pixels": np.array([GOOD[:4] + [value] + GOOD[5:]], np.float32)})


def test_a_value_just_inside_and_just_outside_the_range():
    assert checked("digits", [[16] * 64]).max() == 1.0
    with pytest.raises(InputError, match="has value 16.0001 at position"):
        checked("digits", [[0] * 63 + [16.0001]])


def random_json(rng: np.random.Generator, depth: int = 0):
    """An arbitrary JSON-decoded value."""
    kind = int(rng.integers(0, 8 if depth < 3 else 6))
    if kind < 6:
        return [None, True, "7", float("nan"), float(rng.uniform(-2, 20)), int(rng.integers(0, 17))][kind]
    if kind == 6:
        return {"k": random_json(rng, depth + 1)}
    return [random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]


def almost_valid_example(rng: np.random.Generator):
    """A valid digits example with zero to two random corruptions."""
    example = rng.integers(0, 17, 64).tolist()
    for _ in range(int(rng.integers(0, 3))):
        if rng.random() < 0.7:
            example[int(rng.integers(0, len(example)))] = random_json(rng)
        else:
            example = example[: int(rng.integers(0, len(example)))]
    return example


def test_arbitrary_json_raises_only_the_clients_errors():
    rng = np.random.default_rng(0)
    outcomes = set()
    for _ in range(300):
        inputs = [almost_valid_example(rng) for _ in range(int(rng.integers(0, 3)))]
        if rng.random() < 0.1:
            inputs = random_json(rng)
        try:
            array = checked("digits", inputs)
        except (InvalidInput, InputError) as exc:  # anything else escapes and fails the test
            assert str(exc)
            outcomes.add("error")
            continue
        assert array.dtype == np.float32 and array.shape == (len(inputs), 64)
        assert 0 <= array.min() and array.max() <= 1
        outcomes.add("ok")
    assert outcomes == {"ok", "error"}


def test_integral_floats_and_ints_mix():
    array = checked("digits", [[0, 16.0, 3, 4.5] * 16])
    assert array.dtype == np.float32
    np.testing.assert_allclose(array[0, :4], [0, 1, 3 / 16, 4.5 / 16])


# ---- mobilenet ----


def test_mobilenet_replicas_on_sim0_and_sim3_are_the_seeded_network():
    replicas = {}

    def worker(device):
        replicas[device] = replica(ENTRIES["mobilenet"], device)

    # Concurrently, beside another model loading: the loads share Paddle's one program builder.
    run_threads(lambda: worker("sim:0"), lambda: worker("sim:3"), lambda: replica(ENTRIES["digits"], "sim:1"))
    a, b = replicas["sim:0"], replicas["sim:3"]
    assert set(a.parameter_devices().values()) == {"sim:0"}
    assert set(b.parameter_devices().values()) == {"sim:3"}
    for (name, wa), wb in zip(a.network.state_dict().items(), b.network.state_dict().values()):
        np.testing.assert_array_equal(wa.numpy(), wb.numpy(), err_msg=name)

    images = np.random.default_rng(0).uniform(-1, 1, (4, 3, 32, 32)).astype(np.float32)
    out_a, raw_a = run(a, {"image": images})
    out_b, raw_b = run(b, {"image": images})
    assert a.output_device() == b.output_device() == "cpu"  # the sim exception (docs/service.md)
    assert raw_a["output"] | raw_b["output"] == {"cpu"}
    assert set(out_a) == {"fetch_name_0"} and out_a["fetch_name_0"].shape == (4, 10)
    np.testing.assert_allclose(out_a["fetch_name_0"], out_b["fetch_name_0"], atol=1e-5)
    with PlaceEnv("cpu"):  # the saved program is the network examples.py builds from its seed
        network = bundled.mobilenet_network()
        with paddle.no_grad():
            expected = network(paddle.to_tensor(images)).numpy()
    np.testing.assert_allclose(out_a["fetch_name_0"], expected, rtol=1e-4, atol=1e-4)
    json.dumps(out_a["fetch_name_0"].tolist(), allow_nan=False)


@pytest.mark.parametrize("array, message", [
    (np.zeros((1, 3, 32), np.float32), "input 'image' has shape [1, 3, 32]; expected [-1, 3, 32, 32]"),
    (np.zeros((2, 3, 32, 31), np.float32), "input 'image' has shape [2, 3, 32, 31]"),
    (np.zeros((1, 3, 32, 32), np.float64), "input 'image' has datatype FP64; expected FP32"),
])
def test_mobilenet_refuses_a_wrong_shape_or_datatype(array, message):
    with pytest.raises(InputError) as caught:
        ENTRIES["mobilenet"].default.inputs[0].check(array)
    assert message in str(caught.value)


def test_mobilenet_takes_any_finite_or_non_finite_value_now():
    # No value range any more (a plain jit.save model has none): what JSON carries goes through.
    array = checked("mobilenet", [np.full((3, 32, 32), 1e30).tolist()])
    assert array.shape == (1, 3, 32, 32) and array.dtype == np.float32


# ---- lifecycle ----


def test_each_replica_is_fresh_and_finalize_releases_it():
    version = ENTRIES["digits"].default
    a, b = version.model_class(), version.model_class()
    assert a is not b
    a.initialize(placeenv.to_place("sim:1"), version.context)  # backend auto: paddle.jit.load on sim
    assert a.network is not None and b.network is None and a.parameter_devices()
    a.finalize()
    assert a.network is None and a.parameter_devices() == {}
    with pytest.raises(RuntimeError, match="execute before initialize"):
        a.execute({"pixels": paddle.zeros([1, 64])})
    b.initialize(placeenv.to_place("cpu"), version.context)  # and a Predictor on the CPU
    assert b.predictor is not None and b.network is None and b.backend == "inference"
    b.finalize()
    assert b.predictor is None
    with pytest.raises(RuntimeError, match="execute before initialize"):
        b.execute({"pixels": paddle.zeros([1, 64])})


def test_a_model_py_without_a_program_runs_in_python_on_its_device():
    # tests/repository/faulty: a dygraph Linear built by Model.load, no saved program. Unlike a
    # saved program on sim, its outputs stay on the replica's device, and the checks expect that.
    entries, errors = scan([Path(TEST_REPOSITORY)], ["faulty"], max_batch_size=8,
                           max_batch_delay_ms=2.0)
    assert errors == []
    entry = entries["faulty"]
    assert entry.default.program is None
    model = entry.default.model_class()
    model.initialize(placeenv.to_place("sim:2"), entry.default.context)
    assert set(model.parameter_devices().values()) == {"sim:2"} and model.output_device() == "sim:2"
    outputs, raw = run(model, {"values": np.array([[1, 2, 3, 4], [0, 0, 0, 0.5]], np.float32)})
    assert raw["output"] == {"sim:2"}
    np.testing.assert_allclose(outputs["sum"], [[10], [0.5]])
    with pytest.raises(RuntimeError, match="injected model failure"):
        run(model, {"values": np.array([[-1, 0, 0, 0]], np.float32)})
