"""Batches by shape, served (tests/repository: ``widths`` takes rows of any width; ``widths_padded`` is
the same model with ``batch_padding`` on the width; ``call_split`` calls ``affine`` with all its rows):

* requests of two widths, queued together behind a held worker, run as a batch of each width: none
  fails a join and is run again alone (the control of the join that failed before);
* with ``batch_padding``, the same requests share one forward pass, and each answer is the one it gets
  alone (its row totals are those of its own columns, zeros padded);
* a request, or a model's call (``Model.infer``), of more rows than the model's max_batch_size runs as
  forward passes of at most that many, its answer the same; a part that fails fails it once.

Forward passes are counted by Triton's statistics (``/v2/models/m/stats``: ``batch_stats``). And the
padding itself (``forward.padded``): arrays, tensors and a step's rows, each at the end of the dims named.
"""

from __future__ import annotations


import httpx
import numpy as np
import paddle
import pytest
from support.servers import TEST_REPOSITORY, batches, free_port, queued_together, ran

from placeenv.serve.engine.forward import Handed, padded


MODELS = "gate,widths,widths_padded,affine,call_split,faulty"
MAX_BATCH = 8  # the service's max_batch_size, affine's and faulty's


@pytest.fixture(scope="module")
def service_settings():
    # One worker: what a held worker leaves queued is what its next batches are made of.
    return {"MODELS": MODELS, "DEVICES": "sim:0", "WORKERS_PER_DEVICE": 1, "MODEL_REPOSITORY": TEST_REPOSITORY,
            "MAX_BATCH_SIZE": MAX_BATCH, "GRPC_PORT": free_port()}


def body(x: np.ndarray, name: str = "x") -> dict:
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def outputs(answer: httpx.Response) -> dict[str, np.ndarray]:
    assert answer.status_code == 200, answer.text
    return {o["name"]: np.reshape(o["data"], o["shape"]).astype(np.float32) for o in answer.json()["outputs"]}


def rows(width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-9, 9, (1, width)).astype(np.float32)


# Four requests of width 3 and four of width 5, interleaved.
MIXED = [rows(3 if i % 2 == 0 else 5, i) for i in range(8)]


def test_requests_of_two_shapes_run_as_a_batch_of_each_and_none_alone(service):
    before = batches(service.url, "widths")
    answers = queued_together(service, "widths", [body(x) for x in MIXED])
    for x, answer in zip(MIXED, answers):
        found = outputs(answer)
        np.testing.assert_allclose(found["y"], x * 2 + 1)
        np.testing.assert_allclose(found["total"], x.sum(axis=1, keepdims=True))
    # Two forward passes of 4: each width among its own. Joined as one, the batch failed to join and ran
    # its 8 requests one by one ({1: 8}).
    assert ran(service.url, "widths", before) == {4: 2}
    assert "running each alone" not in service.output()


def test_with_batch_padding_requests_of_two_widths_share_one_forward_pass(service):
    before = batches(service.url, "widths_padded")
    answers = queued_together(service, "widths_padded", [body(x) for x in MIXED])
    assert ran(service.url, "widths_padded", before) == {8: 1}  # one batch, padded to width 5
    for x, answer in zip(MIXED, answers):
        shared = outputs(answer)
        alone = outputs(httpx.post(f"{service.url}/v2/models/widths_padded/infer", json=body(x), timeout=30))
        width = x.shape[1]
        # Its rows have the batch's width: its own columns are its answer alone, the padded ones 0 * 2 + 1.
        assert shared["y"].shape == (1, 5) and alone["y"].shape == (1, width)
        np.testing.assert_array_equal(shared["y"][:, :width], alone["y"])
        np.testing.assert_array_equal(shared["y"][:, width:], np.ones((1, 5 - width), np.float32))
        np.testing.assert_array_equal(shared["total"], alone["total"])
        np.testing.assert_allclose(alone["total"], x.sum(axis=1, keepdims=True))


X20 = np.arange(80, dtype=np.float32).reshape(20, 4) - 40


def stats(url: str, model: str) -> dict:
    (found,) = httpx.get(f"{url}/v2/models/{model}/stats", timeout=30).json()["model_stats"]
    return found


def test_a_request_of_more_rows_than_max_batch_size_runs_as_passes_of_at_most_that_many(service):
    before, counts = batches(service.url, "affine"), stats(service.url, "affine")
    answer = outputs(httpx.post(f"{service.url}/v2/models/affine/infer", json=body(X20), timeout=30))
    np.testing.assert_allclose(answer["y"], X20 * 2 + 1)
    assert ran(service.url, "affine", before) == {4: 1, 8: 2}  # it ran as one pass of 20 before
    # One request, of 20 examples, in 3 forward passes.
    after = stats(service.url, "affine")
    assert (after["inference_stats"]["success"]["count"] - counts["inference_stats"]["success"]["count"],
            after["inference_count"] - counts["inference_count"],
            after["execution_count"] - counts["execution_count"]) == (1, 20, 3)


def test_a_models_call_of_more_rows_than_the_called_models_max_batch_size_is_split(service):
    before = {m: batches(service.url, m) for m in ("affine", "call_split")}
    answer = outputs(httpx.post(f"{service.url}/v2/models/call_split/infer", json=body(X20), timeout=30))
    np.testing.assert_allclose(answer["y"], X20 * 2 + 1)  # what affine answers the 20 rows unsplit
    assert ran(service.url, "call_split", before["call_split"]) == {20: 1}  # the caller's one pass
    assert ran(service.url, "affine", before["affine"]) == {4: 1, 8: 2}  # its call: 8, 8 and 4


def test_a_part_that_fails_fails_its_request_once(service):
    values = np.ones((20, 4), np.float32)
    values[10, 0] = -1  # the second part's: faulty raises
    before = stats(service.url, "faulty")
    answer = httpx.post(f"{service.url}/v2/models/faulty/infer", json=body(values, "values"), timeout=30)
    assert answer.status_code == 500 and "injected model failure" in answer.json()["error"], answer.text
    after = stats(service.url, "faulty")
    failed = after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
    succeeded = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert (failed, succeeded) == (1, 0)
    # The control: the same rows without the failing value answer.
    values[10, 0] = 1
    good = outputs(httpx.post(f"{service.url}/v2/models/faulty/infer", json=body(values, "values"), timeout=30))
    np.testing.assert_allclose(good["sum"], values.sum(axis=1, keepdims=True))


def test_padding_pads_arrays_tensors_and_a_steps_rows_at_the_end_of_the_dims_named():
    array = np.ones((1, 2, 3), np.float32)
    tensor = paddle.to_tensor(np.full((2, 2, 4), 2, np.float32))
    step = Handed(paddle.to_tensor(np.arange(40, dtype=np.float32).reshape(4, 2, 5)), "cpu", (1, 3))
    widest = step.tensor.numpy()[1:3]
    found = padded([array, tensor, step], (2,), -1.0)
    assert found[2] is step  # the widest: as it was, joined where it is
    found = [part if isinstance(part, np.ndarray) else part.numpy() for part in found[:2]] + [widest]
    assert [part.shape for part in found] == [(1, 2, 5), (2, 2, 5), (2, 2, 5)]
    np.testing.assert_array_equal(found[0], np.concatenate([array, np.full((1, 2, 2), -1, np.float32)], axis=2))
    np.testing.assert_array_equal(found[1][..., :4], 2)
    np.testing.assert_array_equal(found[1][..., 4], -1)
    narrow = Handed(step.tensor[:, :, :3], "cpu", (0, 2))  # a step's rows, narrower: padded as a tensor
    np.testing.assert_array_equal(padded([narrow, step], (2,), 0.0)[0].numpy(),
                                  np.pad(step.tensor.numpy()[:2, :, :3], ((0, 0), (0, 0), (0, 2))))
