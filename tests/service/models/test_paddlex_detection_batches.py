"""A PaddleX detector's model in process (models/paddlex_pipeline.py): a PaddleDetection export answers its
whole batch's boxes in one ``[M, 6]`` with a count an image, which ``per_image`` turns into a row an image,
so that requests' calls share the detector's forward passes, and the runner joins back (``joined``) into what
PaddleX's predictor reads. Each image's boxes from a batch of three images of other sizes and box counts, on
a sim device, are its boxes run alone."""

from __future__ import annotations

import shutil
import types

import numpy as np
import pytest
from support import paddlex_reference, standin_models

from placeenv.serve.engine.forward import forward
from placeenv.serve.engine.standalone import replica
from placeenv.serve.models import paddlex, paddlex_pipeline
from placeenv.serve.models.base import Model, host_inputs

PIPELINE = paddlex_reference.PIPELINE.with_name("object_detection_pipeline.yaml")


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    directory = tmp_path_factory.mktemp("detect")
    standin_models.copy_to(standin_models.DETECTION, directory / standin_models.DETECTION)
    shutil.copyfile(PIPELINE, directory / "pipeline.yaml")
    entries, _, _ = paddlex.read("detect", directory / "pipeline.yaml", 8, 5.0)
    link = entries["detect.pipeline"].versions[1].context.parameters["links"]["SubModules.ObjectDetection"]
    return replica(entries["detect.ObjectDetection"], "sim:0"), link


def _prepared(seed: int, width: int, height: int) -> dict[str, np.ndarray]:
    """An image as PaddleX's detection predictor hands it to its runner (the stand-in's inference.yml: RGB,
    resized to a square, normalised, channels first) with its scales, [h, w]."""
    import cv2

    image, _ = standin_models.shapes(seed, width, height)
    side = standin_models.SIDE
    resized = cv2.resize(image[:, :, ::-1], (side, side), interpolation=cv2.INTER_CUBIC).astype(np.float32) / 255
    normal = (resized - np.asarray(standin_models.MEAN, np.float32)) / np.asarray(standin_models.STD, np.float32)
    return {"image": np.ascontiguousarray(normal.transpose(2, 0, 1)[None]),
            "scale_factor": np.asarray([[side / height, side / width]], np.float32)}


def test_each_images_boxes_from_a_shared_batch_are_its_own(detector):
    detector, link = detector
    (boxes, counts) = detector.context.outputs
    prepared = [_prepared(seed, *size) for seed, size in ((0, (640, 480)), (2, (500, 800)), (5, (700, 700)))]
    requests = [host_inputs(detector.context, p) for p in prepared]
    alone = [forward(detector, [request], batched=True, examples=1) for request in requests]
    together = forward(detector, requests, batched=True, examples=3)
    numbers = together[counts.name].tolist()
    assert together[boxes.name].shape == (3, max(numbers), 6) and numbers == [a[counts.name][0] for a in alone]
    for i, answer in enumerate(alone):
        np.testing.assert_allclose(together[boxes.name][i, :numbers[i]], answer[boxes.name][0], atol=1e-4)
        assert (together[boxes.name][i, numbers[i]:] == -1).all()  # the rows past its own
    # The runner hands PaddleX's predictor the export's own answer: the batch's boxes in one array, in order.
    rows, given = paddlex_pipeline.joined(link, [together[boxes.name], together[counts.name]])
    assert rows.shape == (sum(numbers), 6) and given.tolist() == numbers
    np.testing.assert_allclose(rows, np.concatenate([a[boxes.name][0, :n] for a, n in zip(alone, numbers)]), atol=1e-4)


def test_without_per_image_the_batch_does_not_split(detector, monkeypatch):
    """The control: with the model's plain postprocess the export's answer is PaddleDetection's, all the
    batch's boxes in one array, and the workers' forward refuses it."""
    detector, _ = detector
    requests = [host_inputs(detector.context, _prepared(seed, 640, 480)) for seed in (0, 1)]
    monkeypatch.setattr(detector, "postprocess", types.MethodType(Model.postprocess, detector))
    with pytest.raises(RuntimeError, match=r"do not have the batch's 2 rows"):
        forward(detector, requests, batched=True, examples=2)


def test_images_without_boxes_split_and_join_back(detector):
    """A batch whose images answer 2, 0 and 1 boxes, and one whose images answer none ([N, 0, 6]); each
    joined back as the export gives it."""
    _, link = detector
    split = paddlex_pipeline.per_image(Model, "counts", ("boxes",))().postprocess
    rows = np.arange(18, dtype=np.float32).reshape(3, 6)
    found = split({"boxes": rows, "counts": np.array([2, 0, 1], np.int32)})
    assert found["boxes"].shape == (3, 2, 6) and (found["boxes"][0] == rows[:2]).all()
    assert (found["boxes"][1] == -1).all() and (found["boxes"][2, 0] == rows[2]).all()
    assert (found["boxes"][2, 1] == -1).all()
    assert (paddlex_pipeline.joined(link, [found["boxes"], found["counts"]])[0] == rows).all()
    none = split({"boxes": np.zeros((0, 6), np.float32), "counts": np.zeros(2, np.int32)})
    assert none["boxes"].shape == (2, 0, 6)
    assert paddlex_pipeline.joined(link, [none["boxes"], none["counts"]])[0].shape == (0, 6)
    with pytest.raises(RuntimeError, match="answered 3 rows of boxes, its counts says 2"):
        split({"boxes": rows, "counts": np.array([1, 1], np.int32)})
