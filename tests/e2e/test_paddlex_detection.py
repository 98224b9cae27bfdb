"""PaddleX's object detection pipelines, served from their files with no code, against PaddleX itself: object
detection, small object detection and instance segmentation (rows of ``paddlex_pipeline.FIELDS``: their
boxes; an instance's mask in ``result``): one service serves the first two, another the third (PaddleX 3.7.2
itself runs a PicoDet export wrong in a process that created this Mask-RT-DETR one first: docs/models.md).

Each file is PaddleX's own with its model the detector tests/support/standin_models.py builds (no detector can
be downloaded here): under PicoDet-S's name (tests/support/object_detection_pipeline.yaml), a PaddleDetection
export's inputs (image, scale_factor) and outputs (the batch's boxes [M, 6], their count an image); the same
under PP-YOLOE_plus_SOD-S's (small_object_detection_pipeline.yaml); and under Mask-RT-DETR-S's, with RT-DETR's
inputs and a mask a box (instance_segmentation_pipeline.yaml). The images are white pages of several sizes
with red, green and blue rectangles (``standin_models.shapes``), PNG and JPEG, and a white one. PaddleX's own
predictor on the same images is the reference (its pipeline is that predictor with the file's settings, and
needs ``paddlex[cv]``, which the reference venv does not install): the same boxes, classes and order,
coordinates within 2 px and scores within 0.01, each mask to the pixel, with 4 requests in flight (over v2
REST and gRPC) so that the detector's batches join requests. PaddleX serving's ``/object-detection``,
``/small-object-detection`` and ``/instance-segmentation`` answer with its own schemas (an instance's mask
run-length encoded as PaddleX serving encodes it). The controls: a request's threshold no score passes leaves
no box.
"""

from __future__ import annotations

import base64
import json
import shutil

import httpx
import numpy as np
import pytest
from support import paddlex_reference, standin_models

PIPELINE = paddlex_reference.PIPELINE.with_name("object_detection_pipeline.yaml")
IMAGES = standin_models.SHAPES
KEYS = ("class_ids", "scores", "label_names", "coordinates")


@pytest.fixture(scope="module")
def images():
    return standin_models.shapes_images()


#: The other two pipelines: their repository names -> their files and models.
OTHERS = {"small": ("small_object_detection_pipeline.yaml", standin_models.SMALL_DETECTION),
          "instances": ("instance_segmentation_pipeline.yaml", standin_models.INSTANCES)}


def _place(root, name: str, file: str, model: str):
    standin_models.copy_to(model, root / name / model)
    shutil.copyfile(PIPELINE.with_name(file), root / name / "pipeline.yaml")
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = _place(tmp_path_factory.mktemp("repository"), "detect", PIPELINE.name, standin_models.DETECTION)
    return _place(root, "small", *OTHERS["small"])


@pytest.fixture(scope="module")
def reference(images):
    """PaddleX's answers: each image with the file's settings (``threshold: null``: the export's 0.5), then
    the first two with a request's threshold 0.95, then per class (red at 1: none, the others 0.5), then
    an empty dict (every class at 0.5, the boxes then in class order, as PaddleX filters a dict's)."""
    asked = [(data, {}) for data, _ in images] + [(data, {"threshold": 0.95}) for data, _ in images[:2]] \
        + [(data, {"threshold": {"0": 1.0}}) for data, _ in images[:2]] \
        + [(data, {"threshold": {}}) for data, _ in images[:2]]
    found = paddlex_reference.reference_model(standin_models.DETECTION, standin_models.export(standin_models.DETECTION),
                                              asked, {"threshold": None, "img_size": None}, ("boxes",))
    return [paddlex_reference.box_fields(result["boxes"]) for result in found]


@pytest.fixture(scope="module")
def served(repository):
    with paddlex_reference.served(repository, "detect,small") as proc:
        yield proc


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    root = _place(tmp_path_factory.mktemp("instances"), "instances", *OTHERS["instances"])
    with paddlex_reference.served(root, "instances") as proc:
        yield proc


def over_v2(url: str, data: bytes, parameters: dict | None = None) -> dict:
    return paddlex_reference.as_lists(paddlex_reference.over_v2(url, "detect", data, parameters), KEYS)


differences = paddlex_reference.box_differences


def _iou(a, b) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _objects(objects) -> dict[str, list]:
    """PaddleX serving's detected objects (or instances) as the typed outputs hold them."""
    return {"class_ids": [o.categoryId for o in objects], "label_names": [o.categoryName for o in objects],
            "scores": [o.score for o in objects], "coordinates": [list(o.bbox) for o in objects]}


def test_the_boxes_are_paddlexs(served, images, reference):
    url = served.url[len("http://"):]
    # the detector's batches join requests
    answers = paddlex_reference.together(served, over_v2, [data for data, _ in images])
    wrong = {i: differences(a, r) for i, (a, r) in enumerate(zip(answers, reference)) if differences(a, r)}
    assert wrong == {}, wrong
    # And they are the rectangles drawn: each found, of its colour, overlapping it by 80% or more.
    for answer, (_, drawn) in zip(answers, images):
        assert len(answer["coordinates"]) == len(drawn)
        for name, box in drawn:
            assert any(label == name and _iou(found, box) > 0.8
                       for label, found in zip(answer["label_names"], answer["coordinates"])), (name, box, answer)
    # A request's threshold, a number or per class, as PaddleX's predict takes it.
    for (data, _), expected in zip(images[:2], reference[len(images):len(images) + 2]):
        answer = over_v2(url, data, {"threshold": 0.95})
        assert not differences(answer, expected) and all(s > 0.95 for s in answer["scores"])
    for (data, _), expected, plain, empty in zip(images[:2], reference[len(images) + 2:], reference,
                                                 reference[len(images) + 4:]):
        answer = over_v2(url, data, {"threshold": '{"0": 1.0}'})
        assert not differences(answer, expected)
        assert "red" not in answer["label_names"] and "red" in plain["label_names"]
        assert not differences(over_v2(url, data, {"threshold": "{}"}), empty)
        assert sorted(empty["scores"]) == sorted(plain["scores"])  # PaddleX's {}: every class at 0.5
    assert answers[-1] == {"class_ids": [], "scores": [], "label_names": [], "coordinates": []}  # the white image


def test_paddlex_servings_api_answers_with_its_schema(served, images, reference):
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas.object_detection import InferResult

    for body, expected in (({}, reference[0]), ({"threshold": 0.95}, reference[len(images)]),
                           ({"threshold": {0: 1.0}}, reference[len(images) + 2])):
        answer = httpx.post(f"{served.url}/object-detection",
                            json={"image": base64.b64encode(images[0][0]).decode(), **body}, timeout=120)
        assert answer.status_code == 200, answer.text
        found = _objects(AIStudioResultResponse[InferResult].model_validate(answer.json()).result.detectedObjects)
        assert not differences(found, expected), (found, expected)


@pytest.mark.parametrize("body, says", [
    ({"image": base64.b64encode(b"x").decode(), "threshold": "high"}, '"loc": "body.threshold'),  # PaddleX's check
    ({"image": "http://127.0.0.1:9/cat.png"}, "image: URLs are not fetched"),
    ({"image": "***"}, "image is not base64"),
    ({"image": base64.b64encode(b"not an image").decode()}, "not an image OpenCV can decode"),
])
def test_a_bad_request_is_a_422_in_paddlexs_error_shape(served, body, says):
    answer = httpx.post(f"{served.url}/object-detection", json=body, timeout=30)
    assert answer.status_code == 422, answer.text
    found = answer.json()
    assert set(found) == {"logId", "errorCode", "errorMsg"} and says in found["errorMsg"], found


def test_a_bad_threshold_over_v2_is_a_400(served, images):
    """Not a number nor a mapping; what PaddleX does with a number of any size is PaddleX's."""
    from tritonclient.utils import InferenceServerException

    for threshold in ("all", "{0.5", True):
        with pytest.raises(InferenceServerException) as refused:
            over_v2(served.url[len("http://"):], images[0][0], {"threshold": threshold})
        assert refused.value.status() == "400" and "parameter threshold" in refused.value.message()


def test_the_detector_is_a_model_of_the_repository_batched_as_the_file_says(served):
    config = httpx.get(f"{served.url}/v2/models/detect.ObjectDetection/config", timeout=30).json()
    assert config["max_batch_size"] == 4
    assert httpx.get(f"{served.url}/v2/models/detect", timeout=30).json()["outputs"] == [
        {"name": "result", "datatype": "BYTES", "shape": [1]}, {"name": "class_ids", "datatype": "INT32", "shape": [-1]},
        {"name": "scores", "datatype": "FP32", "shape": [-1]},
        {"name": "label_names", "datatype": "BYTES", "shape": [-1]},
        {"name": "coordinates", "datatype": "FP32", "shape": [-1, 4]}]


@pytest.fixture(scope="module")
def others(images):
    """PaddleX's answers of the other two: each image with the file's threshold 0.5, then the first with a
    request's 1.0: their boxes and, of instances, masks."""
    asked = [(data, {}) for data, _ in images] + [(images[0][0], {"threshold": 1.0})]
    return {name: paddlex_reference.reference_model(model, standin_models.export(model), asked, {"threshold": 0.5},
                                                    ("boxes", "masks") if name == "instances" else ("boxes",))
            for name, (_, model) in OTHERS.items()}


@pytest.mark.parametrize("name", list(OTHERS))
def test_the_other_pipelines_boxes_and_masks_are_paddlexs(request, images, others, name):
    served = request.getfixturevalue("instances" if name == "instances" else "served")

    def ask(target: str, job) -> tuple[dict, list | None]:
        data, parameters = job
        result = paddlex_reference.over_v2(target, name, data, parameters)
        return paddlex_reference.as_lists(result, KEYS), json.loads(result.as_numpy("result")[0]).get("masks")

    asked = [(data, None) for data, _ in images] + [(images[0][0], {"threshold": 1.0})]
    answers = paddlex_reference.together(served, ask, asked)  # the detector's batches join requests
    wrong = {i: (a, r["boxes"]) for i, ((a, _), r) in enumerate(zip(answers, others[name]))
             if differences(a, paddlex_reference.box_fields(r["boxes"]))}
    assert wrong == {}, wrong
    assert [masks for _, masks in answers] == [r.get("masks") for r in others[name]]
    # The stand-in finds what was drawn (each rectangle's colour, in some order), an instance's mask the
    # rectangle's pixels in its box; the controls find none.
    assert [sorted(a["label_names"]) for a, _ in answers[:len(IMAGES)]] == \
        [sorted(colour for colour, _ in drawn) for _, drawn in images[:len(IMAGES)]]
    if name == "instances":
        filled = [np.mean(mask) for _, masks in answers[:len(IMAGES)] for mask in masks]
        assert filled and min(filled) > 0.8, filled
    assert answers[len(IMAGES)][0]["label_names"] == [] and answers[-1][0]["label_names"] == []


def test_paddlex_servings_small_object_and_instance_apis_answer_with_their_schemas(served, instances, images, others):
    import pycocotools.mask as mask_util
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas import instance_segmentation, small_object_detection

    body = {"image": base64.b64encode(images[0][0]).decode()}
    answer = httpx.post(f"{served.url}/small-object-detection", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:500]
    found = AIStudioResultResponse[small_object_detection.InferResult].model_validate(answer.json()).result
    assert not differences(_objects(found.detectedObjects), paddlex_reference.box_fields(others["small"][0]["boxes"]))
    answer = httpx.post(f"{instances.url}/instance-segmentation", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:500]
    found = AIStudioResultResponse[instance_segmentation.InferResult].model_validate(answer.json()).result
    assert not differences(_objects(found.instances), paddlex_reference.box_fields(others["instances"][0]["boxes"]))
    # Each mask, decoded by pycocotools as a client of PaddleX serving decodes it, is PaddleX's.
    decoded = [mask_util.decode({"counts": o.mask.rleResult, "size": list(o.mask.size)}).tolist()
               for o in found.instances]
    assert decoded == others["instances"][0]["masks"]
    none = httpx.post(f"{instances.url}/instance-segmentation", json={**body, "threshold": 1.0}, timeout=120)
    assert none.status_code == 200 and none.json()["result"]["instances"] == [], none.text[:500]
    for url, path in ((served.url, "/small-object-detection"), (instances.url, "/instance-segmentation")):
        refused = httpx.post(f"{url}{path}", json={"image": "***"}, timeout=30)
        assert refused.status_code == 422 and "image is not base64" in refused.json()["errorMsg"]
