"""PaddleX's semantic segmentation pipeline, served from its file by the one mechanism with no code of its
own (a row of ``paddlex_pipeline.FIELDS`` for its class map), against PaddleX itself.

The file is PaddleX's semantic_segmentation.yaml with its model the stand-in tests/support/standin_models.py
builds under PP-LiteSeg-T's name (tests/support/semantic_segmentation_pipeline.yaml; no PaddleSeg export can
be downloaded here): each pixel's class, background or the red, green or blue of the rectangles
``standin_models.shapes`` draws. The images: 8 of several sizes, PNG and JPEG. PaddleX's own predictor on the
same images is the reference (its pipeline is that predictor, and needs ``paddlex[cv]``, which the reference
venv does not install): the same class of every pixel, with 4 requests in flight, over v2 and PaddleX serving's
``/semantic-segmentation`` (its ``labelMap``, row by row, and ``size``).
"""

from __future__ import annotations

import base64
import json

import cv2
import httpx
import numpy as np
import pytest
from support import paddlex_reference, standin_models

PIPELINE = paddlex_reference.PIPELINE.with_name("semantic_segmentation_pipeline.yaml")
IMAGES = [(0, 640, 480, ".png"), (1, 900, 700, ".jpg"), (2, 500, 800, ".png"), (3, 320, 320, ".png"),
          (4, 1200, 500, ".jpg"), (5, 640, 480, ".png"), (6, 480, 640, ".jpg"), (7, 1000, 1000, ".png")]


@pytest.fixture(scope="module")
def images():
    found = []
    for seed, width, height, suffix in IMAGES:
        image, drawn = standin_models.shapes(seed, width, height)
        found.append((cv2.imencode(suffix, image, [cv2.IMWRITE_JPEG_QUALITY, 95] if suffix == ".jpg" else [])[1]
                      .tobytes(), drawn))
    return found


@pytest.fixture(scope="module")
def reference(images):
    found = paddlex_reference.reference_model(
        standin_models.SEGMENTATION, standin_models.export(standin_models.SEGMENTATION),
        [(data, {}) for data, _ in images], {}, ("pred",))
    return [np.asarray(result["pred"], np.int32).reshape((1, *np.shape(result["pred"])[-2:])) for result in found]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with paddlex_reference.served_standin(tmp_path_factory.mktemp("repository"), "segment",
                                          standin_models.SEGMENTATION, PIPELINE) as proc:
        yield proc


def test_every_pixels_class_is_paddlexs(served, images, reference):
    def ask(target: str, data: bytes):
        result = paddlex_reference.over_v2(target, "segment", data)
        return result.as_numpy("pred"), json.loads(result.as_numpy("result")[0])

    answers = paddlex_reference.together(served, ask, [data for data, _ in images])
    for (pred, result), expected, (data, drawn), spec in zip(answers, reference, images, IMAGES):
        assert pred.shape == (1, spec[2], spec[1]) and pred.shape == expected.shape
        assert (pred == expected).all(), f"{(pred != expected).sum()} pixels differ from PaddleX's"
        assert np.asarray(result["pred"]).reshape(pred.shape).tolist() == pred.tolist()  # the JSON, the same map
        # And the classes are the rectangles drawn: each one's centre is its colour's class.
        names = {name: i + 1 for i, name in enumerate(standin_models.COLOURS)}
        for name, (x1, y1, x2, y2) in drawn:
            assert pred[0, int((y1 + y2) / 2), int((x1 + x2) / 2)] == names[name]
    assert all(set(np.unique(p).tolist()) > {0} for p, _ in answers)  # background and colours, not one class


def test_paddlex_servings_api_answers_with_its_schema(served, images, reference):
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas.semantic_segmentation import InferResult

    body = {"image": base64.b64encode(images[2][0]).decode()}
    answer = httpx.post(f"{served.url}/semantic-segmentation", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    result = AIStudioResultResponse[InferResult].model_validate(answer.json()).result
    assert list(result.size) == list(reference[2].shape[1:])  # [height, width], as PaddleX serving's app gives it
    assert result.labelMap == reference[2].reshape(-1).tolist() and result.image is None
    for bad, says in (({"targetSize": "big"}, "targetSize"),
                      ({"image": "http://127.0.0.1:9/a.png"}, "URLs are not fetched")):
        refused = httpx.post(f"{served.url}/semantic-segmentation", json={**body, **bad}, timeout=30)
        assert refused.status_code == 422 and says in refused.json()["errorMsg"], refused.text
