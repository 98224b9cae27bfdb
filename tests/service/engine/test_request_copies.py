"""How many copies the service makes of one request's input, from its arrival to its first device step: a
page through PaddleX's OCR pipeline, served in this process on a sim device.

The page arrives as encoded bytes and is decoded once (preprocess). The pipeline's CPU step hands the decoded
array to PaddleX's own pipeline as it is (the model ``takes_arrays``: no host tensor made and read back), and
PaddleX's processors make the text detector's input. The detector's job joins it into a host tensor over
the array's own memory (``batch_tensor``'s view), and the one copy the service makes is the upload to the
device. What is counted: every copy of at least half the page's bytes into a host tensor
(``_internals.fill_host``), out of a tensor (``Tensor.numpy``) or onto another place (``_internals.copy_to``)
until the detector's execute starts; PaddleX's own processors' arrays are PaddleX's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
from types import SimpleNamespace

import cv2
import httpx
import numpy as np
import paddle
import pytest
from support import ocr_models, paddlex_reference

import placeenv
import placeenv.tensors
from placeenv import _internals
from placeenv.serve.config import Settings
from placeenv.serve.engine.local import local_gateway
from placeenv.serve.http.app import create_app
from placeenv.serve.models import base
from placeenv.serve.models.paddlex_pipeline import PaddleXPipeline

DETECTOR = "ocr.TextDetection"


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """PaddleX's OCR file over the PP-OCRv5 exports, the detector named to run as a Paddle program (``engine:
    paddle_dynamic``: the service's backend ``jit``), so that it runs on the sim device whatever ``auto``
    would measure."""
    root = tmp_path_factory.mktemp("copies")
    (root / "ocr").mkdir()
    for kind in ("det", "rec"):
        shutil.copytree(ocr_models.models()[kind], root / "ocr" / ocr_models.NAMES[kind])
    text = paddlex_reference.PIPELINE.read_text()
    anchor = "    model_name: PP-OCRv5_mobile_det\n"
    assert anchor in text
    (root / "ocr" / "pipeline.yaml").write_text(text.replace(anchor, anchor + "    engine: paddle_dynamic\n", 1))
    return root


def _page() -> np.ndarray:
    page = np.full((160, 640, 3), 255, np.uint8)
    cv2.putText(page, "Hello PaddleOCR 2026", (20, 100), cv2.FONT_HERSHEY_SIMPLEX, 1.5, (0, 0, 0), 3)
    return page


class Copies:
    """The large copies (at least ``size`` bytes) the process makes through the shortcuts every tensor of the
    request path goes through, in order: ("fill" | "numpy" | "to <device>", bytes), and ("execute", model)
    as each replica's execute starts."""

    def __init__(self, monkeypatch, size: int) -> None:
        self.size, self.events, self.on = size, [], False
        shortcuts = SimpleNamespace(**{name: getattr(_internals, name) for name in dir(_internals)
                                       if not name.startswith("__")})
        shortcuts.fill_host = self._wrap(_internals.fill_host, lambda tensor, array: ("fill", array.nbytes))
        shortcuts.copy_to = self._wrap(_internals.copy_to, lambda tensor, place: (
            f"to {placeenv.device_name(place)}", _bytes(tensor)))
        monkeypatch.setattr(placeenv.tensors, "_pd", shortcuts)
        monkeypatch.setattr(paddle.Tensor, "numpy", self._wrap(paddle.Tensor.numpy, lambda tensor, *a, **k: (
            "numpy", _bytes(tensor))))
        execute = base.Model.execute

        def noted(model, inputs):
            if self.on:
                self.events.append(("execute", model.context.name))
            return execute(model, inputs)

        monkeypatch.setattr(base.Model, "execute", noted)

    def _wrap(self, call, event):
        def counted(*args, **kwargs):
            if self.on:
                what, nbytes = event(*args, **kwargs)
                if nbytes >= self.size:
                    self.events.append((what, nbytes))
            return call(*args, **kwargs)
        return counted

    def until_first(self, model: str) -> list[tuple]:
        """The copies before ``model``'s first execute (``AssertionError`` if it never ran)."""
        ends = [i for i, event in enumerate(self.events) if event == ("execute", model)]
        assert ends, self.events
        return [event for event in self.events[:ends[0]] if event[0] != "execute"]


def _bytes(tensor) -> int:
    return int(np.prod(tensor.shape)) * paddle.core.size_of_dtype(tensor.dtype)


@contextlib.asynccontextmanager
async def _served(repository):
    app = create_app(Settings(devices="sim:0", workers_per_device=1, models="ocr", model_repository=str(repository)),
                     local_gateway)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://in-process") as client:
            yield client


def test_a_page_is_copied_once_from_its_arrival_to_the_first_device_step(repository, monkeypatch):
    """One page posted to PaddleX serving's /ocr three times (the first after start, the others the same): the
    copies made of it up to the detector's execute. The controls, on the same service: the pipeline's CPU
    step given a host tensor (as a network's execute is) reads it back; and a batch's host tensor made as a
    copy (``host_tensor``) rather than a view as well: the path as it was before."""
    page = _page()
    body = {"file": base64.b64encode(cv2.imencode(".png", page)[1].tobytes()).decode(), "fileType": 1,
            "visualize": False}
    copies = Copies(monkeypatch, page.nbytes // 2)

    async def three(client) -> list[tuple]:
        found = []
        for _ in range(3):
            copies.events.clear()
            copies.on = True
            answer = await client.post("/ocr", json=body, timeout=300)
            copies.on = False
            assert answer.status_code == 200, answer.text[:500]
            texts = answer.json()["result"]["ocrResults"][0]["prunedResult"]["rec_texts"]
            assert any("PaddleOCR" in text for text in texts), texts
            found.append([what for what, _ in copies.until_first(DETECTOR)])
        assert found[0] == found[1] == found[2], found
        return found[0]

    async def main():
        async with _served(repository) as client:
            ours = await three(client)
            monkeypatch.setattr(PaddleXPipeline, "takes_arrays", False)
            tensor_step = await three(client)
            monkeypatch.setattr(base, "host_view", placeenv.tensors.host_tensor)
            before = await three(client)
        return ours, tensor_step, before

    ours, tensor_step, before = asyncio.run(main())
    assert ours == ["to sim:0"]  # the detector's input, uploaded
    assert tensor_step == ["numpy", "to sim:0"]
    assert before == ["fill", "numpy", "fill", "to sim:0"]
