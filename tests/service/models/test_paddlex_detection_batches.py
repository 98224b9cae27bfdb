"""A PaddleX object detection pipeline's steps in process (models/paddlex_detection.py): a PaddleDetection
export answers its whole batch's boxes in one ``[M, 6]`` with a count an image, which ``per_image`` turns
into a row an image, so that requests share the detector's forward passes. Each image's boxes from a
batch of three images of other sizes and box counts, on a sim device, are its boxes run alone."""

from __future__ import annotations

import shutil
import types

import cv2
import numpy as np
import pytest
from support import paddlex_reference, standin_models

from placeenv.serve.engine.forward import forward
from placeenv.serve.engine.standalone import forward as one_request
from placeenv.serve.engine.standalone import replica
from placeenv.serve.models import paddlex, paddlex_detection
from placeenv.serve.models.base import Model, host_inputs

PIPELINE = paddlex_reference.PIPELINE.with_name("object_detection_pipeline.yaml")


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    directory = tmp_path_factory.mktemp("detect")
    standin_models.copy_to(standin_models.DETECTION, directory / standin_models.DETECTION)
    shutil.copyfile(PIPELINE, directory / "pipeline.yaml")
    entries, _, _ = paddlex.read("detect", directory / "pipeline.yaml", 8, 5.0)
    return {step: replica(entries[f"detect.{step}"], place)
            for step, place in (("prepare", "cpu"), ("ObjectDetection", "sim:0"), ("boxes", "cpu"))}


def _prepared(steps, seed: int, width: int, height: int) -> dict[str, np.ndarray]:
    image, _ = standin_models.shapes(seed, width, height)
    data = cv2.imencode(".png", image)[1].tobytes()
    return one_request(steps["prepare"], {"image": np.array([data], dtype=object)})


def test_each_images_boxes_from_a_shared_batch_are_its_own(steps):
    detector = steps["ObjectDetection"]
    (image, scale), (boxes, counts) = detector.context.inputs, detector.context.outputs
    prepared = [_prepared(steps, seed, *size) for seed, size in ((0, (640, 480)), (2, (500, 800)), (5, (700, 700)))]
    requests = [host_inputs(detector.context, {image.name: p["img"], scale.name: p["scale_factors"]})
                for p in prepared]
    alone = [forward(detector, [request], batched=True, examples=1) for request in requests]
    together = forward(detector, requests, batched=True, examples=3)
    numbers = together[counts.name].tolist()
    assert together[boxes.name].shape == (3, max(numbers), 6) and numbers == [a[counts.name][0] for a in alone]
    for i, answer in enumerate(alone):
        np.testing.assert_allclose(together[boxes.name][i, :numbers[i]], answer[boxes.name][0], atol=1e-4)
        assert (together[boxes.name][i, numbers[i]:] == -1).all()  # the rows past its own
    # And the last step reads an image's rows alone: the same boxes as from its own forward pass.
    last = [one_request(steps["boxes"], {"detections": together[boxes.name][i:i + 1][:, :numbers[i] + 2],
                                         "counts": together[counts.name][i:i + 1], "size": prepared[i]["size"]})
            for i in range(3)]
    own = [one_request(steps["boxes"], {"detections": a[boxes.name], "counts": a[counts.name],
                                        "size": p["size"]}) for a, p in zip(alone, prepared)]
    for mine, theirs in zip(last, own):
        assert mine["label_names"].tolist() == theirs["label_names"].tolist() and len(mine["scores"])
        np.testing.assert_allclose(mine["coordinates"], theirs["coordinates"], atol=1e-3)


def test_without_per_image_the_batch_does_not_split(steps, monkeypatch):
    """The control: with the model's plain postprocess the export's answer is PaddleDetection's, all the
    batch's boxes in one array, and the workers' forward refuses it."""
    detector = steps["ObjectDetection"]
    prepared = [_prepared(steps, seed, 640, 480) for seed in (0, 1)]
    requests = [host_inputs(detector.context, dict(zip((s.name for s in detector.context.inputs),
                                                       (p["img"], p["scale_factors"])))) for p in prepared]
    monkeypatch.setattr(detector, "postprocess", types.MethodType(Model.postprocess, detector))
    with pytest.raises(RuntimeError, match=r"do not have the batch's 2 rows"):
        forward(detector, requests, batched=True, examples=2)


def test_images_without_boxes_split_and_answer_none(steps):
    """A batch whose images answer 2, 0 and 1 boxes, and one whose images answer none ([N, 0, 6]); the last
    step answers an image without boxes with empty outputs."""
    split = paddlex_detection.per_image(Model, "boxes", "counts")().postprocess
    rows = np.arange(18, dtype=np.float32).reshape(3, 6)
    found = split({"boxes": rows, "counts": np.array([2, 0, 1], np.int32)})
    assert found["boxes"].shape == (3, 2, 6) and (found["boxes"][0] == rows[:2]).all()
    assert (found["boxes"][1] == -1).all() and (found["boxes"][2, 0] == rows[2]).all()
    assert (found["boxes"][2, 1] == -1).all()
    none = split({"boxes": np.zeros((0, 6), np.float32), "counts": np.zeros(2, np.int32)})
    assert none["boxes"].shape == (2, 0, 6)
    with pytest.raises(RuntimeError, match="answered 3 boxes, its counts says 2"):
        split({"boxes": rows, "counts": np.array([1, 1], np.int32)})
    answer = one_request(steps["boxes"], {"detections": none["boxes"][:1], "counts": np.zeros(1, np.int32),
                                          "size": np.array([[640, 480]], np.int32)})
    assert {k: v.shape for k, v in answer.items()} == {"class_ids": (0,), "scores": (0,), "label_names": (0,),
                                                       "coordinates": (0, 4)}
