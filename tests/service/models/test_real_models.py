"""PaddleOCR's real PP-OCRv5 exports, copied into a repository as PaddleX writes them (no version
directory, no config, no code), served on the defaults by one real service process on the CPU: found
runnable before ready (oneDNN cannot run all of the detector: the default warm-up finds it and the
Predictor is rebuilt with oneDNN's fused convolutions only), answering full-size images over HTTP and
gRPC within the default body limit and timeout, under Paddle's own names, and saying what runs them."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from support import ocr_models
from support.servers import ServiceProcess, free_port

from placeenv.serve.config import Settings

#: What a client of the detector sends: one page at the size PaddleOCR's examples resize to.
PAGE = (1, 3, 640, 640)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    ocr_models.export("det", root)
    ocr_models.export("rec", root)
    return root


@pytest.fixture(scope="module")
def served(repository):
    grpc_port = free_port()
    proc = ServiceProcess(devices="cpu", workers_per_device=2, models="det,rec", model_repository=repository,
                          grpc_port=grpc_port)
    try:
        yield proc.wait_ready(), f"127.0.0.1:{grpc_port}"
    finally:
        proc.stop()


def _page(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(PAGE, dtype=np.float32)


def test_the_bare_detector_answers_full_size_pages_on_the_defaults_over_http_and_grpc(served):
    proc, target = served
    defaults = Settings(_cli_parse_args=[])
    assert _page(0).nbytes + 1024 < defaults.max_body_bytes  # the default limit takes it (the old 4 MiB did not)
    grpc = tg.InferenceServerClient(target)

    def over_http(seed: int) -> np.ndarray:
        http = th.InferenceServerClient(proc.url[len("http://"):])  # one a thread: it is not thread-safe
        image = th.InferInput("x", list(PAGE), "FP32")
        image.set_data_from_numpy(_page(seed), binary_data=True)
        return http.infer("det", [image], outputs=[th.InferRequestedOutput("fetch_name_0", binary_data=True)]
                          ).as_numpy("fetch_name_0")

    def over_grpc(seed: int) -> np.ndarray:
        image = tg.InferInput("x", list(PAGE), "FP32")
        image.set_data_from_numpy(_page(seed))
        return grpc.infer("det", [image]).as_numpy("fetch_name_0")

    # Four at once on the 2 CPU workers: each waits behind others, within the default timeout.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda call: call[0](call[1]),
                                [(over_http, 0), (over_grpc, 1), (over_http, 2), (over_grpc, 0)]))
    for answer in answers:
        assert answer.shape == (1, 1, 640, 640) and np.isfinite(answer).all() and 0 <= answer.min() <= answer.max() <= 1
    np.testing.assert_allclose(answers[0], answers[3], rtol=1e-4, atol=1e-5)  # the same page, either protocol


def test_each_export_says_what_runs_it_and_why(served):
    proc, _ = served
    det = httpx.get(f"{proc.url}/v2/models/det/config").json()
    rec = httpx.get(f"{proc.url}/v2/models/rec/config").json()
    platforms = {"inference": "paddle_inference", "onnxruntime": "onnxruntime_onnx", "openvino": "openvino"}
    for config in (det, rec):
        choice = json.loads(config["parameters"]["backend_choice"]["string_value"])["cpu"]
        # Every backend this machine has was measured, and agreed with Paddle Inference's answers.
        assert set(choice["timings_ms"]) == {"inference", "onnxruntime", "openvino"} and not choice["passed_over"]
        assert choice["serves"] == min(choice["timings_ms"], key=choice["timings_ms"].get)
        assert config["platform"] == platforms[choice["serves"]]
        assert json.loads(config["parameters"]["backends"]["string_value"])["cpu"].startswith(
            f"{choice['serves']} (")
    assert [o["name"] for o in det["output"]] == ["fetch_name_0"]
    # oneDNN cannot run the detector: the Predictor it measured ran with oneDNN's fused convolutions only.
    det_choice = json.loads(det["parameters"]["backend_choice"]["string_value"])["cpu"]
    assert "oneDNN for its fused convolutions only: with all its kernels the program failed" in det_choice["inference"]
    assert "ConvertPirAttribute" in det_choice["inference"]
    # The control: the recogniser's Predictor runs with all of oneDNN, as the config asks by default.
    assert "inference" not in json.loads(rec["parameters"]["backend_choice"]["string_value"])["cpu"]


def test_a_page_over_the_body_limit_is_refused_naming_the_limit(repository):
    """The control for the default limit: the old 4 MiB refuses the same page, over HTTP and gRPC."""
    grpc_port = free_port()
    proc = ServiceProcess(devices="cpu", workers_per_device=1, models="det", model_repository=repository,
                          grpc_port=grpc_port, max_body_bytes=4 * 1024 * 1024)
    try:
        proc.wait_ready()
        image = th.InferInput("x", list(PAGE), "FP32")
        image.set_data_from_numpy(_page(0), binary_data=True)
        with pytest.raises(th.InferenceServerException, match="413"):
            th.InferenceServerClient(proc.url[len("http://"):]).infer("det", [image])
        image = tg.InferInput("x", list(PAGE), "FP32")
        image.set_data_from_numpy(_page(0))
        with pytest.raises(tg.InferenceServerException, match="RESOURCE_EXHAUSTED"):
            tg.InferenceServerClient(f"127.0.0.1:{grpc_port}").infer("det", [image])
    finally:
        proc.stop()
