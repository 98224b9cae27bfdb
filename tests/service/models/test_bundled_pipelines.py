"""The bundled pipelines, served end to end with tritonclient (HTTP and gRPC), against their steps
done by hand on the CPU (Pillow's decoding, the saved programs run with ``paddle.jit.load``, the
host steps' own functions):

* ``classify``: JPEG or PNG bytes -> decoded and resized on CPU workers -> mobilenet on a sim
  device -> the 3 likeliest labels, as BYTES, on a CPU worker;
* ``ocr``: PNG pages -> the detector on a device -> the lines found and cut out on a CPU worker,
  which reads them all with one call to the recogniser (``Model.infer``) -> each page's text as
  BYTES, and its line count, which must be the number drawn.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from support.models import run_locally
from support.servers import free_port

from placeenv.serve.models import BUNDLED, examples, images
from placeenv.serve.models.base import softmax
from placeenv.serve.models.configs import read_config

LABELS = read_config("classify_topk", BUNDLED / "classify_topk")[0].parameters["labels"]


@pytest.fixture(scope="module")
def service_settings():
    return {"MODELS": "classify,ocr,ocr_rec", "DEVICES": "sim:0,sim:1", "WORKERS_PER_DEVICE": 2,
            "GRPC_PORT": free_port()}


@pytest.fixture(scope="module")
def clients(service, service_settings):
    return {"http": (th, th.InferenceServerClient(service.url.removeprefix("http://"))),
            "grpc": (tg, tg.InferenceServerClient(f"127.0.0.1:{service_settings['GRPC_PORT']}"))}


def encoded(module, name: str, items: list[bytes]):
    tensor = module.InferInput(name, [len(items)], "BYTES")
    tensor.set_data_from_numpy(np.array(items, dtype=np.object_))
    return tensor


def classify_by_hand(items: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    pixels = images.decode_all(np.array(items, dtype=object), "image", mode="RGB", size=(32, 32))
    (logits,) = run_locally(examples.home("mobilenet") / "1" / "model", pixels)
    probabilities = softmax(logits)
    best = np.argsort(-probabilities, axis=1, kind="stable")[:, :3]
    return np.array(LABELS, dtype=object)[best], np.take_along_axis(probabilities, best, axis=1)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classify_takes_encoded_images_and_answers_the_models_labels(clients, protocol):
    module, client = clients[protocol]
    rng = np.random.default_rng(3)
    photos = [rng.integers(0, 256, (48 + 8 * i, 64, 3), dtype=np.uint8) for i in range(3)]
    items = [images.encode(photos[0], "JPEG", quality=90), images.encode(photos[1], "PNG"),
             images.encode(photos[2], "JPEG")]
    answer = client.infer("classify", [encoded(module, "image", items)])
    labels, scores = classify_by_hand(items)
    found = answer.as_numpy("labels")
    assert found.dtype == np.object_ and found.shape == (3, 3)
    assert [[v.decode() if isinstance(v, bytes) else v for v in row] for row in found.tolist()] == labels.tolist()
    np.testing.assert_allclose(answer.as_numpy("scores"), scores, rtol=1e-4, atol=1e-5)


def test_a_file_that_is_not_an_image_is_refused_naming_the_step_and_quoting_nothing(service):
    body = {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": ["GIF89a secret-s3cr3t"]}]}
    answer = httpx.post(f"{service.url}/v2/models/classify/infer", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error.startswith("pipeline 'classify', step 1 ('classify_decode'): input 'image' element 0 is not a "
                            "PNG or JPEG image"), error
    assert "s3cr3t" not in answer.text


def ocr_by_hand(pages: list[np.ndarray]) -> list[bytes]:
    texts = []
    for page in pages:
        image = (page / 255).astype(np.float32)[None]
        (rows,) = run_locally(examples.home("ocr_det") / "1" / "model", image[None])
        lines = examples.text_lines(rows[0])
        (logits,) = run_locally(examples.home("ocr_rec") / "1" / "model", examples.line_crops(image, lines))
        texts.append("\n".join(examples.read_lines(logits)).encode())
    return texts


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ocr_reads_as_many_lines_as_each_page_has_with_the_recogniser_called_once_a_batch(service, clients,
                                                                                           protocol):
    module, client = clients[protocol]
    rng = np.random.default_rng(11)
    drawn = [1, 3, 2, 2, 1]
    pages = [examples.ocr_page(n, rng) for n in drawn]
    before = service.total("inference_pipeline_step_queue_duration_seconds_count", pipeline="ocr_read",
                           step="ocr_rec")
    answer = client.infer("ocr", [encoded(module, "page", [images.encode(p) for p in pages])])
    assert answer.as_numpy("lines").tolist() == drawn
    assert answer.as_numpy("text").tolist() == ocr_by_hand(pages)
    # ocr_read read the 9 lines of the request's 5 pages in one call (and one forward pass) of ocr_rec.
    assert service.total("inference_pipeline_step_queue_duration_seconds_count", pipeline="ocr_read",
                         step="ocr_rec") == before + 1


def test_the_pipelines_say_what_they_are(clients):
    _, client = clients["http"]
    index = {row["name"]: row["state"] for row in client.get_model_repository_index()}
    assert {"classify", "classify_decode", "mobilenet", "classify_topk", "ocr", "ocr_decode", "ocr_det",
            "ocr_read", "ocr_rec"} <= set(index) and set(index.values()) == {"READY"}
    metadata = client.get_model_metadata("ocr")
    assert metadata["platform"] == "ensemble"
    assert metadata["inputs"] == [{"name": "page", "datatype": "BYTES", "shape": [-1]}]
