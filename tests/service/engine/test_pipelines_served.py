"""Pipelines and calls between models, served (tests/repository: ``chain`` is x -> affine -> affine ->
rowsum, affine a dygraph layer on a sim device, rowsum on CPU workers of its own; ``caller`` calls
affine from its execute):

* the tensor one device step hands the next on its device is neither downloaded nor uploaded, by the
  sim plugin's own copy counts, where the control (``chain_host``, whose second step takes host
  arrays) shows the one download and one upload;
* answers equal the steps computed by hand, over tritonclient's HTTP and gRPC, in one process and
  across a front end; under load every step runs where its tensors are, is place-checked, and
  counts no leak, while with isolation off the same load counts leaks for each step;
* a step's failure answers its request naming the step; a call cycle is refused; a call waits no
  longer than its request's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import paddle
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from support import wait_until
from support.servers import TEST_REPOSITORY, ServiceProcess, free_port, workers_held

import placeenv
from placeenv.serve.config import Settings
from placeenv.serve.engine.job import Job
from placeenv.serve.engine.local import local_gateway
from placeenv.serve.engine.path import Completion
from placeenv.serve.http.app import create_app

X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3


def by_hand(x: np.ndarray) -> np.ndarray:
    """chain: rowsum(affine(affine(x))), affine being x * 2 + 1."""
    return ((x * 2 + 1) * 2 + 1).sum(axis=1, keepdims=True)


def v2_json(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


# -- the copies between two steps, counted by the sim plugin (in this process: the models' notes) --


@contextlib.asynccontextmanager
async def in_process(**settings):
    """The service's app in this process (its engine's workers, threads here), and a client to it."""
    app = create_app(Settings(**settings), local_gateway)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://in-process") as client:
            yield client


def notes() -> list:
    """The affine models' notes (copy counts as each execute starts and ends), in time order, cleared."""
    modules = [sys.modules[f"placeenv_repository.{name}.v1"] for name in ("affine", "affine_host")]
    found = sorted(note for module in modules for note in module.NOTES)
    for module in modules:
        module.NOTES.clear()
    return found


async def copies_between_the_device_steps(client, pipeline: str) -> tuple[int, int, int]:
    """(transfers, uploads, downloads) on the device from the end of the first step's execute to the
    start of the second's: what handing the tensor over cost."""
    notes()
    answer = await client.post(f"/v2/models/{pipeline}/infer", json=v2_json(X))
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(np.reshape(answer.json()["outputs"][0]["data"], (2, 1)), by_hand(X))
    first_exit, second_enter = notes()[1:3]
    assert first_exit[1:4] == ("affine", "exit", "sim:1") and second_enter[2:4] == ("enter", "sim:1"), \
        (first_exit[:4], second_enter[:4])
    before, after = first_exit[4], second_enter[4]
    return after.transfers - before.transfers, after.uploads - before.uploads, after.downloads - before.downloads


def test_a_tensor_handed_to_the_next_step_on_its_device_is_neither_downloaded_nor_uploaded():
    async def main():
        async with in_process(devices="sim:1", workers_per_device=1, models="chain,chain_host",
                              model_repository=TEST_REPOSITORY) as client:
            return [(await copies_between_the_device_steps(client, "chain"),
                     await copies_between_the_device_steps(client, "chain_host")) for _ in range(3)]

    for handed, through_the_host in asyncio.run(main()):
        assert handed == (0, 0, 0)
        # The control: the same count sees the host round trip, one download and one upload.
        assert through_the_host == (2, 1, 1)
    # The loop ran on this (the main) thread: chain_host's second step preprocessed there, in a callback
    # from a worker on sim:1. Its PlaceEnv('cpu') closed back onto the loop's own device, not the worker's
    # (a callback run in a copy of the worker's context left the main thread's Tracer on sim:1).
    paddle.set_device("sim:2")
    assert placeenv.device_name(paddle.Tensor(np.ones(1, "float32")).place) == "sim:2"


# -- a real service ------------------------------------------------------------------------------

TIMEOUT_S = 3
MODELS = "chain,caller,call_host,call_thread,affine_host,cycle_a,cycle_b,faulty_chain,call_gate,gate"


@pytest.fixture(scope="module")
def service_settings():
    return {"MODELS": MODELS, "DEVICES": "sim:0,sim:1", "WORKERS_PER_DEVICE": 2, "GRPC_PORT": free_port(),
            "REQUEST_TIMEOUT_S": TIMEOUT_S}


def post_all(url: str, model: str, bodies: list[dict], clients: int = 16) -> list[httpx.Response]:
    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            limit = asyncio.Semaphore(clients)

            async def one(body):
                async with limit:
                    return await http.post(f"/v2/models/{model}/infer", json=body)

            return await asyncio.gather(*(one(b) for b in bodies))

    return asyncio.run(main())


def test_an_answered_request_leaves_no_cycle_for_the_collector():
    # Each answered job goes, its inputs with it, as its answer is sent: none waits in a reference cycle
    # for the collector's next full pass (a served page's arrays waited there, hundreds of MiB of them
    # over an OCR run). A model's own request, one split into parts, a pipeline's steps, a model's call,
    # and a call split into parts; the collector off meanwhile, so what is left in a cycle stays to count.
    def rows(n: int) -> dict:
        return v2_json(np.arange(4 * n, dtype=np.float32).reshape(n, 4))

    async def main():
        async with in_process(devices="sim:1", workers_per_device=1, model_repository=TEST_REPOSITORY,
                              models="affine,chain,rowsum,caller,call_split") as client:
            gc.collect()
            gc.disable()
            try:
                for model, n in (("affine", 2), ("affine", 20), ("chain", 2), ("caller", 2), ("call_split", 20)):
                    answer = await client.post(f"/v2/models/{model}/infer", json=rows(n))
                    assert answer.status_code == 200, (model, answer.text)
                gc.set_debug(gc.DEBUG_SAVEALL)
                found = gc.collect()
                return found, [type(o).__name__ for o in gc.garbage if isinstance(o, (Job, Completion))]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()

    found, left = asyncio.run(main())
    assert found > 0  # the count sees cycles (the client's and the loop's own are there)
    assert left == [], f"{len(left)} answered jobs and completions left in cycles: {sorted(set(left))}"


def test_a_pipeline_answers_what_its_steps_compute_over_tritonclients_http_and_grpc(service, service_settings):
    http = th.InferenceServerClient(service.url.removeprefix("http://"))
    grpc = tg.InferenceServerClient(f"127.0.0.1:{service_settings['GRPC_PORT']}")
    for module, client in ((th, http), (tg, grpc)):
        x = module.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X)
        np.testing.assert_allclose(client.infer("chain", [x]).as_numpy("sum"), by_hand(X))
    metadata = http.get_model_metadata("chain")
    assert metadata["platform"] == "ensemble" and metadata["versions"] == ["1"]
    assert [o["name"] for o in metadata["outputs"]] == ["sum"]
    config = http.get_model_config("chain")
    assert config["platform"] == "ensemble"
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["affine", "affine", "rowsum"]
    assert grpc.is_model_ready("chain")
    # /predict too: its answer's timings are the steps' (each a sum over them) and the whole request's.
    answer = httpx.post(f"{service.url}/predict", json={"model": "chain", "inputs": X.tolist()}, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [row["sum"] for row in body["outputs"]] == by_hand(X).tolist()
    timings = body["timings"]
    assert set(timings) == {"preprocess_ms", "queue_ms", "compute_ms", "total_ms"}
    assert min(timings.values()) >= 0 and timings["total_ms"] >= timings["queue_ms"] + timings["compute_ms"]


def test_under_load_each_step_runs_where_its_tensors_are_place_checked_with_no_leak(service):
    before = service.metrics()
    bodies = [v2_json(X + i) for i in range(64)]
    answers = post_all(service.url, "chain", bodies)
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(np.reshape(answer.json()["outputs"][0]["data"], (2, 1)), by_hand(X + i))

    def grown(name, **labels):
        after = service.metrics()
        return sum(v - before.get(k, 0.0) for k, v in after.items()
                   if k[0] == name and all(dict(k[1]).get(a) == b for a, b in labels.items()))

    # affine's tensor stayed on its device for the second affine, every time: never moved, never a
    # host array; rowsum, on CPU workers only, took a host array (made once a batch, on the device's worker).
    assert grown("inference_pipeline_handoffs_total", pipeline="chain", step="affine#2", way="device") == 64
    assert grown("inference_pipeline_handoffs_total", pipeline="chain", step="affine#2") == 64
    assert grown("inference_pipeline_handoffs_total", pipeline="chain", step="rowsum", way="host") == 64
    queued = "inference_pipeline_step_queue_duration_seconds_count"
    assert grown(queued, pipeline="chain", step="rowsum", device="cpu") == 64  # its CPU workers
    for step in ("affine", "affine#2"):
        on = {d: grown(queued, pipeline="chain", step=step, device=d) for d in ("sim:0", "sim:1")}
        assert sum(on.values()) == 64 and all(on.values()), on  # both devices took the load
    assert grown("inference_pipeline_step_batch_size_count", pipeline="chain", step="rowsum") == 64
    assert grown("inference_pipeline_step_compute_duration_seconds_count", pipeline="chain") == 3 * 64
    # Every step's worker checked its places, the CPU step's too, and found no leak.
    assert grown("placeenv_place_checks_total", device="cpu", stage="output") >= 1
    assert grown("placeenv_place_checks_total", stage="batch") >= 3 * 64 / 8  # (batches of up to 8)
    assert service.total("placeenv_device_leaks_total") == 0
    assert service.total("placeenv_pipeline_step_device_leaks_total") == 0
    # Triton's statistics: the pipeline's requests, and its steps' jobs counted by their models.
    http = th.InferenceServerClient(service.url.removeprefix("http://"))
    stats = {s["name"]: s["inference_stats"]["success"]["count"]
             for s in http.get_inference_statistics()["model_stats"]}
    assert stats["chain"] >= 64 and stats["affine"] >= 2 * 64 and stats["rowsum"] >= 64


def test_a_batch_of_a_steps_jobs_and_its_models_own_requests_answers_each_its_way(service):
    """affine's jobs for chain keep their output on the device, its own requests want arrays: queued
    behind held workers, they share batches, and each gets its own answer."""
    before = service.total("inference_batch_size_count", model="affine")
    examples_before = service.total("inference_batch_size_sum", model="affine")

    async def main():
        async with httpx.AsyncClient(base_url=service.url, timeout=60) as http:
            sent = [http.post(f"/v2/models/{m}/infer", json=v2_json(X + i)) for i in range(8)
                    for m in ("chain", "affine")]
            return await asyncio.gather(*sent)

    with ThreadPoolExecutor(1) as pool, workers_held(service.url, 4):
        running = pool.submit(asyncio.run, main())
        wait_until(lambda: service.total("inference_queue_depth") >= 16, 30, "the requests did not queue")
    answers = running.result(60)
    for i, (chain, affine) in enumerate(zip(answers[::2], answers[1::2])):
        assert chain.status_code == affine.status_code == 200, (chain.text, affine.text)
        np.testing.assert_allclose(np.reshape(chain.json()["outputs"][0]["data"], (2, 1)), by_hand(X + i))
        np.testing.assert_allclose(np.reshape(affine.json()["outputs"][0]["data"], X.shape), (X + i) * 2 + 1)
    batches = service.total("inference_batch_size_count", model="affine") - before
    examples = service.total("inference_batch_size_sum", model="affine") - examples_before
    assert examples / batches > 2, (examples, batches)  # requests of both kinds shared forward passes


def test_a_step_that_fails_answers_its_request_naming_the_step_and_no_other(service):
    bad = np.array([[-1, 0, 0, 0]], dtype=np.float32)  # affine makes -1 of it: faulty raises
    answers = post_all(service.url, "faulty_chain", [v2_json(bad)] + [v2_json(X) for _ in range(7)])
    assert answers[0].status_code == 500
    assert answers[0].json()["error"].startswith(
        "pipeline 'faulty_chain', step 2 ('faulty'): model 'faulty' failed on this request: RuntimeError: "
        "injected model failure"), answers[0].text
    assert [a.status_code for a in answers[1:]] == [200] * 7


def test_a_request_the_pipeline_does_not_take_is_refused_before_any_step(service):
    wrong = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    answer = httpx.post(f"{service.url}/v2/models/chain/infer", json=wrong, timeout=30)
    assert answer.status_code == 400 and "input 'x' has shape [1, 3]; expected [-1, 4]" in answer.text
    assert httpx.post(f"{service.url}/v2/models/chain/versions/2/infer", json=v2_json(X),
                      timeout=30).status_code == 404


def test_a_model_calls_another_from_its_execute_on_the_device_its_tensor_is_on(service):
    answers = post_all(service.url, "caller", [v2_json(X + i) for i in range(32)])
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(np.reshape(answer.json()["outputs"][0]["data"], X.shape), (X + i) * 2 + 1)
    calls = {d: service.total("inference_pipeline_step_queue_duration_seconds_count", pipeline="caller",
                              step="affine", device=d) for d in ("sim:0", "sim:1")}
    assert all(calls.values()), calls  # (callers batch: a call carries its batch's examples)
    # Each call ran where its caller's tensor was: not once moved, nor taken as a host array.
    ways = service.by_label("inference_pipeline_handoffs_total", "way", pipeline="caller", step="affine")
    assert ways == {"device": sum(calls.values())}, (ways, calls)


def test_a_call_hands_a_model_with_a_preprocess_of_its_own_host_arrays(service):
    answer = httpx.post(f"{service.url}/v2/models/call_host/infer", json=v2_json(X), timeout=30)
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(np.reshape(answer.json()["outputs"][0]["data"], X.shape), X * 2 + 1)
    assert service.by_label("inference_pipeline_handoffs_total", "way", pipeline="call_host") == {"host": 1}


def test_a_call_from_a_thread_the_engine_did_not_start_is_refused_clearly(service):
    # The control: caller's own call, from its worker's thread, is answered (the test above).
    answer = httpx.post(f"{service.url}/v2/models/call_thread/infer", json=v2_json(X), timeout=30)
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert "Model.infer calls another model from execute() or postprocess(), on the worker thread" in error, error
    assert "serves none" in error and "infer_all sends several calls at once" in error, error


def test_a_call_cycle_is_refused_naming_it(service):
    started = time.monotonic()
    answer = httpx.post(f"{service.url}/v2/models/cycle_a/infer", json=v2_json(X), timeout=30)
    assert answer.status_code == 500, answer.text
    assert "a call cycle (cycle_a -> cycle_b -> cycle_a)" in answer.json()["error"]
    assert time.monotonic() - started < TIMEOUT_S  # refused, not waited out


def test_a_call_waits_no_longer_than_its_requests_deadline(service):
    port = {"inputs": [{"name": "port", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    with workers_held(service.url, 4):  # every device worker: the call's job waits in gate's queue
        started = time.monotonic()
        answer = httpx.post(f"{service.url}/v2/models/call_gate/infer", json=port, timeout=60)
        waited = time.monotonic() - started
    assert answer.status_code == 504, answer.text
    assert "deadline" in answer.json()["error"] or "no answer within" in answer.json()["error"]
    assert TIMEOUT_S - 0.5 < waited < TIMEOUT_S + 10, waited  # slack for a slow machine, not for a hang
    wait_until(lambda: httpx.post(f"{service.url}/v2/models/chain/infer", json=v2_json(X),
                                  timeout=30).status_code == 200, 30, "the service does not serve after")


def test_across_a_front_end_the_engine_runs_the_pipeline_and_the_calls():
    with ServiceProcess(MODELS="chain,caller", DEVICES="sim:0,sim:1", WORKERS_PER_DEVICE=1, FRONTENDS=1) as proc:
        for model, expected in (("chain", by_hand(X)), ("caller", X * 2 + 1)):
            answer = httpx.post(f"{proc.url}/v2/models/{model}/infer", json=v2_json(X), timeout=60)
            assert answer.status_code == 200, answer.text
            np.testing.assert_allclose(np.reshape(answer.json()["outputs"][0]["data"], expected.shape), expected)


def test_with_isolation_off_the_same_load_counts_leaks_for_each_step():
    """The negative control of the place checks at every step: stock Paddle, whose set_device moves
    every worker's tensors, under the load that counted none above."""
    with ServiceProcess(MODELS="chain", DEVICES="sim:0,sim:1", WORKERS_PER_DEVICE=2, ISOLATION="off") as proc:
        def leaked() -> dict:
            post_all(proc.url, "chain", [v2_json(X + i) for i in range(32)])
            found = proc.by_label("placeenv_pipeline_step_device_leaks_total", "step", pipeline="chain")
            return found if len(found) >= 2 else {}

        found = wait_until(leaked, 120, lambda: f"no leaks by step: {proc.output()[-2000:]}", interval=0)
        assert set(found) <= {"affine", "affine#2", "rowsum"} and all(v > 0 for v in found.values())
        # (a batch holding both affine steps' jobs counts one device leak for each of them)
        assert proc.total("placeenv_device_leaks_total") >= max(found.values())
