"""KServe's transformer shape, for benchmarks/pipelines.py: a preprocessing service in front of the model
service, the client's chain of steps over HTTP. It takes the classify pipeline's request (the Open
Inference Protocol, a JPEG as BYTES), decodes it on its event loop (the pipeline's own decoding, as a
transformer's synchronous preprocess runs), calls the model service's mobilenet over v2 binary HTTP
(tritonclient's asyncio client), takes the top 3 (the pipeline's classify_topk), and answers in v2.

    PREDICTOR=127.0.0.1:8000 [MODEL=mobilenet] uvicorn benchmarks.transformer_app:app --port 8200
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

import numpy as np
import tritonclient.http.aio as triton
from fastapi import FastAPI, Request

from placeenv.serve.http.v2 import parse, render
from placeenv.serve.models import BUNDLED
from placeenv.serve.models.examples import top_labels
from placeenv.serve.models.images import decode_all
from placeenv.serve.models.configs import read_config
from placeenv.serve.protocol.request import Result

LABELS = np.array([name.encode() for name in read_config("classify_topk", BUNDLED / "classify_topk")[0]
                   .parameters["labels"]], dtype=object)

state: dict = {}


@asynccontextmanager
async def lifespan(app: FastAPI):
    state["predictor"] = triton.InferenceServerClient(os.environ.get("PREDICTOR", "127.0.0.1:8000"), conn_limit=256)
    yield
    await state["predictor"].close()


app = FastAPI(lifespan=lifespan)


@app.post("/v2/models/classify/infer")
async def infer(request: Request):
    parsed, arrays = parse(await request.body(), request.headers.get("inference-header-content-length"))
    pixels = decode_all(arrays["image"], "image", mode="RGB", size=(32, 32))
    image = triton.InferInput("image", list(pixels.shape), "FP32")
    image.set_data_from_numpy(pixels, binary_data=True)
    answer = await state["predictor"].infer(os.environ.get("MODEL", "mobilenet"), [image],
                                            outputs=[triton.InferRequestedOutput("fetch_name_0", binary_data=True)])
    labels, scores = top_labels(answer.as_numpy("fetch_name_0"), LABELS, 3)
    return render(Result("classify", 1, {"labels": labels, "scores": scores}, {"labels": "BYTES", "scores": "FP32"},
                         "", "", len(pixels), True, {}), parsed)
