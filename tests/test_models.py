"""The model registry and the model contract, on CPU and on sim devices."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import paddle
import pytest

from conftest import run_threads, where
import placeenv.serve.models as models
from placeenv.serve.models.base import InputError
from placeenv.serve.models.digits import held_out_split


@pytest.fixture(scope="module")
def held_out():
    x, y = held_out_split()
    return x.tolist(), y


def serve(model: models.Model, inputs: list) -> list[dict]:
    """What a worker does per request: CPU preprocess, move to its device, execute, postprocess."""
    return model.infer(inputs)


def digits_on(device: str) -> models.Model:
    model = models.create("digits")
    model.initialize(device)
    return model


# ---- digits: accuracy and placement ----


def test_digits_held_out_accuracy_on_cpu(held_out):
    x, y = held_out
    outputs = serve(digits_on("cpu"), x)
    labels = np.array([o["label"] for o in outputs])
    assert (labels == y).mean() >= 0.95
    assert all(len(o["probabilities"]) == 10 and abs(sum(o["probabilities"]) - 1) < 1e-6 for o in outputs)


def test_digits_on_sim1_has_every_weight_there_and_matches_cpu(held_out):
    x, _ = held_out
    model = digits_on("sim:1")
    assert {where(v) for v in model.network.state_dict().values()} == {"sim:1"}
    batch = model.preprocess(x).to(model.place)
    logits = model.execute(batch)
    assert where(logits) == "sim:1"
    cpu = digits_on("cpu")
    expected = cpu.execute(cpu.preprocess(x))
    np.testing.assert_allclose(logits.numpy(), expected.numpy(), atol=1e-5)


def test_replicas_built_in_threads_land_on_their_own_devices(held_out):
    x, _ = held_out
    x = x[:32]
    results = {}

    def worker(device):
        paddle.set_device("sim:0")  # the thread's default differs from the replica's place
        model = digits_on(device)
        results[device] = ({where(v) for v in model.network.state_dict().values()}, serve(model, x))

    run_threads(*(lambda d=d: worker(d) for d in ("sim:1", "sim:2", "sim:3")))
    reference = serve(digits_on("cpu"), x)
    for device, (places, outputs) in results.items():
        assert places == {device}
        for got, want in zip(outputs, reference):
            assert got["label"] == want["label"]
            np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-5)


def test_execute_refuses_a_batch_on_another_device():
    model = digits_on("sim:1")
    batch = model.preprocess([[0] * 64])  # still on CPU
    with pytest.raises(RuntimeError, match="batch on cpu, replica on sim:1"):
        model.execute(batch)


# ---- preprocess ----


def test_preprocess_is_cpu_even_in_a_sim2_thread_and_flat_equals_nested(held_out):
    x, _ = held_out
    flat = x[:3]
    nested = [np.reshape(e, (8, 8)).tolist() for e in flat]
    model = models.create("digits")
    tensors = {}

    def worker():
        paddle.set_device("sim:2")
        assert where(paddle.ones([1])) == "sim:2"  # the thread really is on sim:2
        tensors["flat"] = model.preprocess(flat)
        tensors["nested"] = model.preprocess(nested)
        tensors["after"] = paddle.ones([1])

    run_threads(worker)
    assert where(tensors["flat"]) == where(tensors["nested"]) == "cpu"
    assert where(tensors["after"]) == "sim:2"  # preprocess's CPU scope did not leak out
    assert tensors["flat"].shape == [3, 64]
    np.testing.assert_array_equal(tensors["flat"].numpy(), tensors["nested"].numpy())
    np.testing.assert_allclose(tensors["flat"].numpy(), np.array(flat) / 16, rtol=1e-6)


GOOD = [0] * 64
BAD_INPUTS = {
    "not a list": ({"pixels": GOOD}, "inputs must be a list of examples, got dict"),
    "empty": ([], "inputs is empty"),
    "bare example": (GOOD, "example 0 is a single number; expected shape (64,) or (8, 8)"),
    "short": ([GOOD, [0] * 63], "example 1 has shape (63,); expected shape (64,) or (8, 8)"),
    "8x7": ([[[0] * 7] * 8], "example 0 has shape (8, 7)"),
    "too deep": ([[[[0]] * 8] * 8], "example 0 is nested too deep"),
    "string": ([GOOD[:5] + ["abc"] + GOOD[6:]], "example 0 has a non-numeric value 'abc' at position (5,)"),
    "numeric string": ([["1"] * 64], "example 0 has a non-numeric value '1' at position (0,)"),
    "None example": ([GOOD, None], "example 1 has a non-numeric value None"),
    "None value": ([GOOD[:63] + [None]], "example 0 has a non-numeric value None at position (63,)"),
    "bool": ([[True] * 64], "non-numeric value True"),
    "dict value": ([[{"a": 1}] * 64], "non-numeric value {'a': 1}"),
    "NaN": ([GOOD[:9] + [float("nan")] + GOOD[10:]], "example 0 has a non-finite value nan at position (9,)"),
    "Inf": ([[[0] * 8, [0, 0, float("inf")] + [0] * 5] + [[0] * 8] * 6], "value inf at position (1, 2)"),
    "-Inf": ([[float("-inf")] * 64], "non-finite value -inf"),
    "17": ([GOOD[:3] + [17] + GOOD[4:]], "value 17 at position (3,), outside the allowed range [0, 16]"),
    "negative": ([[-0.5] * 64], "value -0.5 at position (0,), outside the allowed range [0, 16]"),
    "huge int": ([[10**400] * 64], "example 0 has an integer too large for a float"),
    "ragged rows": ([[[0] * 8] * 7 + [[0] * 7]], "example 0 is ragged"),
    "ragged depth": ([[[0, 1], 2]], "example 0 is ragged"),
    "ragged batch": ([GOOD, GOOD, [[0] * 8, [0]]], "example 2 is ragged"),
}


@pytest.mark.parametrize("inputs, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_invalid_inputs_raise_input_error_naming_the_problem(inputs, message):
    with pytest.raises(InputError) as caught:
        models.create("digits").preprocess(inputs)
    assert message in str(caught.value)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_values_are_refused_even_with_an_unbounded_range(value, monkeypatch):
    model = models.create("digits")
    monkeypatch.setattr(model, "value_range", (-math.inf, math.inf))  # the fast range check passes infinities
    with pytest.raises(InputError, match="non-finite value"):
        model.preprocess([GOOD[:4] + [value] + GOOD[5:]])


def test_absurd_nesting_is_an_input_error():
    deep = 0
    for _ in range(500):
        deep = [deep]
    with pytest.raises(InputError, match="nested too deep"):
        models.create("digits").preprocess([deep])


def random_json(rng: np.random.Generator, depth: int = 0):
    """An arbitrary JSON-decoded value."""
    kind = int(rng.integers(0, 8 if depth < 3 else 6))
    if kind < 6:
        return [None, True, "7", float("nan"), float(rng.uniform(-2, 20)), int(rng.integers(0, 17))][kind]
    if kind == 6:
        return {"k": random_json(rng, depth + 1)}
    return [random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]


def almost_valid_example(rng: np.random.Generator):
    """A valid digits example (flat or 8x8) with zero to two random corruptions."""
    example = rng.integers(0, 17, 64).tolist()
    for _ in range(int(rng.integers(0, 3))):
        if rng.random() < 0.7:
            example[int(rng.integers(0, len(example)))] = random_json(rng)
        else:
            example = example[: int(rng.integers(0, len(example)))]
    nested = len(example) == 64 and rng.random() < 0.5
    return [example[r * 8 : r * 8 + 8] for r in range(8)] if nested else example


def test_arbitrary_json_raises_only_input_error():
    rng = np.random.default_rng(0)
    model = models.create("digits")
    outcomes = set()
    for _ in range(300):
        inputs = [almost_valid_example(rng) for _ in range(int(rng.integers(0, 3)))]
        if rng.random() < 0.1:
            inputs = random_json(rng)
        try:
            tensor = model.preprocess(inputs)
            assert where(tensor) == "cpu" and tensor.shape == [len(inputs), 64]
            outcomes.add("ok")
        except InputError as exc:
            assert str(exc)
            outcomes.add("error")
    assert outcomes == {"ok", "error"}


def test_integral_floats_and_ints_mix():
    tensor = models.create("digits").preprocess([[0, 16.0, 3, 4.5] * 16])
    assert tensor.dtype == paddle.float32
    np.testing.assert_allclose(tensor.numpy()[0, :4], [0, 1, 3 / 16, 4.5 / 16])


# ---- mobilenet ----


def test_mobilenet_replicas_on_sim0_and_sim3_are_identical():
    replicas = {}

    def worker(device):
        model = models.create("mobilenet")
        model.initialize(device)
        replicas[device] = model

    # Concurrently, beside another model drawing from Paddle's RNG: the weights must not depend on timing.
    run_threads(lambda: worker("sim:0"), lambda: worker("sim:3"), lambda: digits_on("sim:1"))
    a, b = replicas["sim:0"], replicas["sim:3"]
    assert {where(v) for v in a.network.state_dict().values()} == {"sim:0"}
    assert {where(v) for v in b.network.state_dict().values()} == {"sim:3"}
    for (name, wa), wb in zip(a.network.state_dict().items(), b.network.state_dict().values()):
        np.testing.assert_array_equal(wa.numpy(), wb.numpy(), err_msg=name)

    inputs = np.random.default_rng(0).uniform(-1, 1, (4, 3, 32, 32)).tolist()
    batch = a.preprocess(inputs)
    assert batch.shape == [4, 3, 32, 32] and where(batch) == "cpu"
    start = time.perf_counter()
    out_a = a.execute(batch.to(a.place))
    out_a.numpy()
    elapsed = time.perf_counter() - start
    out_b = b.execute(batch.to(b.place))
    assert out_a.shape == out_b.shape == [4, 10]
    assert where(out_a) == "sim:0" and where(out_b) == "sim:3"
    np.testing.assert_allclose(out_a.numpy(), out_b.numpy(), atol=1e-5)
    assert elapsed < 5, f"batch-4 forward took {elapsed:.2f} s"

    outputs = a.postprocess(out_a)
    assert len(outputs) == 4
    for o in outputs:
        assert set(o) == {"label", "scores"} and 0 <= o["label"] < 10 and len(o["scores"]) == 10
        assert o["label"] == int(np.argmax(o["scores"]))
    json.dumps(outputs, allow_nan=False)


def test_mobilenet_rejects_a_wrong_shape():
    with pytest.raises(InputError, match=r"example 0 has shape \(3, 32\); expected shape \(3, 32, 32\)"):
        models.create("mobilenet").preprocess([[[0.0] * 32] * 3])


# ---- registry and lifecycle ----


def test_registry_lists_describes_and_rejects_unknown_names():
    assert models.available() == ["digits", "faulty", "mobilenet"]
    for name in ("resnet", "../digits", "placeenv.serve.models.digits.Digits", "models.digits.Digits"):
        with pytest.raises(KeyError) as caught:
            models.create(name)
        assert "digits" in str(caught.value) and "mobilenet" in str(caught.value)
    with pytest.raises(KeyError, match="available: digits, faulty, mobilenet"):
        models.create(["digits"])  # an unhashable JSON value, still a KeyError
    described = json.loads(json.dumps(models.describe(), allow_nan=False))
    assert [d["name"] for d in described] == ["digits", "faulty", "mobilenet"]
    assert described[0]["input_shape"] == [64] and described[2]["input_shape"] == [3, 32, 32]
    assert "random weights" in described[2]["description"].lower()
    for d in described:
        assert {"name", "description", "input_shape", "output"} <= set(d)


def test_create_returns_a_fresh_replica_and_finalize_releases_it():
    a, b = models.create("digits"), models.create("digits")
    assert a is not b
    a.initialize("cpu")
    assert a.network is not None and b.network is None
    a.finalize()
    assert a.network is None
    with pytest.raises(RuntimeError, match="execute before initialize"):
        a.execute(paddle.zeros([1, 64]))
