"""PaddleX serving's API for the PaddleX pipeline files the repository serves (models/paddlex.py), so PaddleX's
clients work unchanged: each path of ``ENDPOINTS`` (``POST /ocr``, ``/layout-parsing`` for PP-StructureV3,
``/table-recognition``, ...) answers the served pipeline whose PaddleX app serves it. The request and response
schemas are that app's own (``paddlex.inference.serving.schemas``, imported at the first such request): a
document pipeline's result is its schema's list of a result a page (``_documents``); its error shape ``{logId,
errorCode, errorMsg}`` with the HTTP status as ``errorCode``, its ``logId``. The answer is built from the
pipeline's ``result``, PaddleX's own result as its pipeline object made it, pruned as PaddleX serving prunes
it (models/paddlex_pipeline.py).

A request goes through the same gateway as v2 (one BYTES input, the file's bytes), so it is checked, counted,
batched and answered as any. What differs from PaddleX serving, each a clear 422: a file that is a URL is
fetched only with ``--fetch-urls`` (else any client could make the service fetch addresses); a PDF
(``fileType`` 0) is rendered by PaddleX serving's own reader and each page is a request of the pipeline, all
at once, answered in page order (``--max-pdf-pages``, ``--max-pdf-bytes``). ``visualize`` draws nothing: the
answer carries no visualisations (PP-StructureV3's Markdown images it does carry). The per-request settings
(``textDetThresh`` ..., ``topk``, ``threshold``) go to the pipeline as the request's parameters, each field's
name as PaddleX serving hands it to ``pipeline.predict`` (``textDetThresh`` -> ``text_det_thresh``), checked
by protocol/paddlex.py.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import typing
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import Response

from ..protocol import paddlex as settings_of
from ..protocol.errors import InvalidInput, ServiceError, UnknownModel
from ..protocol.gateway import Gateway
from ..protocol.request import InferRequest
from .responses import JSON, PADDLEX_PATHS, refusal
from .routes import Call, InferRoute

@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One endpoint of PaddleX serving's API: its path, the PaddleX pipelines whose app serves it (by
    ``pipeline_name``: the one the repository serves answers), the request's field that holds the file, and how
    the pipeline's answers (a page each) become its result. Its schemas are PaddleX's own, those of the served
    pipeline's app (``paddlex.inference.serving.schemas``)."""

    path: str
    pipelines: tuple[str, ...]
    field: str
    data: Callable[[Any], bytes]  # the request -> the file's bytes
    result: Callable[..., Any]  # (schemas, models, utils, [outputs a page], info, log_id) -> its InferResult
    summary: str  # what the API's documentation calls it
    about: str  # what GET / and a 405 say of it
    refused: str  # what its 422s refuse
    pdf: bool = False  # whether it reads PDFs (fileType 0), page by page
    given: str = "image"  # the served pipeline's input the file is (models/paddlex_pipeline.py's INPUTS)


def _schemas(kind: str):
    """PaddleX serving's own schemas for the app of pipeline ``kind`` (the service extra installs paddlex)."""
    import importlib

    from paddlex.inference.serving.infra import models, utils
    from paddlex.inference.serving.name_mappings import pipeline_name_to_mod_name

    schemas = importlib.import_module(f"paddlex.inference.serving.schemas.{pipeline_name_to_mod_name(kind)}")
    return schemas, models, utils


async def serve(endpoint: Endpoint, gateway: Gateway, call: Call) -> Response:
    """The adapter: PaddleX's request, ``Gateway.infer`` on the served pipeline (which counts every answer,
    refusals too), PaddleX's answer or error shape."""
    asked: dict[str, Any] = {}
    try:
        served = _served(gateway, endpoint.pipelines)
    except ServiceError as exc:
        gateway.refuse(exc)
        return refusal(exc, endpoint.path, gateway.settings.retry_after_s)
    schemas, models, utils = _schemas(served[1]["pipeline_name"] if served else endpoint.pipelines[0])

    def identify():
        if "request" not in asked:
            asked["request"] = _parse(schemas, call.body)
        request = asked["request"]
        asked["log_id"] = getattr(request, "logId", None) or utils.generate_log_id()
        if served is None:
            raise UnknownModel(f"no PaddleX {' or '.join(endpoint.pipelines)} pipeline is served: put PaddleX's "
                               f"{endpoint.pipelines[0]} pipeline file in the model repository as <name>/pipeline.yaml "
                               "(docs/models.md)")
        name, asked["about"] = served
        asked["parameters"] = _settings(request, asked["about"])
        if "data" not in asked:
            asked["data"] = endpoint.data(request)
        return name, None

    def read(data: bytes):
        def one(model, version) -> InferRequest:
            return InferRequest(model.name, None, {endpoint.given: np.array([data], dtype=object)}, None,
                                call.arrived, len(data), parameters=asked["parameters"] or None)
        return one

    try:
        try:
            fetched = await _fetched(call.body, endpoint.field, gateway)
        except ServiceError as exc:  # (before the gateway reads it: counted here)
            gateway.refuse(exc)
            raise
        if fetched is not None:
            asked["data"] = fetched
        pages = None
        if endpoint.pdf and b'"fileType"' in call.body:
            pages = await _pdf_pages(schemas, call, gateway, asked)
        if pages is None:  # an image: one request of the pipeline
            answers = [await gateway.infer(identify, lambda model, version: read(asked["data"])(model, version))]
            width, height = settings_of.claimed_size(asked["data"]) or (0, 0)
            info = models.ImageInfo(width=width, height=height)
        else:  # a PDF: a request a page, all at once (across the CPU workers and the devices), in page order
            encoded, info = pages
            asked["data"] = encoded[0]
            answers = await asyncio.gather(*(gateway.infer(identify, read(page)) for page in encoded),
                                           return_exceptions=True)
            for answer in answers:  # the first page that fails, in page order, is the answer
                if isinstance(answer, BaseException):
                    raise answer
    except ServiceError as exc:  # PaddleX's error shape, with the request's logId where it gave one
        return refusal(exc, endpoint.path, gateway.settings.retry_after_s, asked.get("log_id"))
    found = endpoint.result(schemas, models, utils, [a.outputs for a in answers], info, asked["log_id"])
    reply = models.AIStudioResultResponse[schemas.InferResult](logId=asked["log_id"], result=found)
    return JSON(reply.model_dump(mode="json", exclude_none=True))


async def _pdf_pages(schemas, call: Call, gateway: Gateway, asked: dict[str, Any]):
    """A PDF request's pages, rendered by PaddleX serving's own reader (``read_pdf``: pypdfium2, its scale
    brought down to PaddleX's pixel limit), each encoded as a PNG (lossless) for the pipeline; and the PDF's
    info. None for a request that is not a PDF. Refused (and counted) before a page is rendered: a PDF over
    ``--max-pdf-bytes`` or ``--max-pdf-pages``, or one pypdfium2 cannot open."""
    try:
        asked["request"] = request = _parse(schemas, call.body)
        if request.fileType != 0 or _is_url(request.file) and "data" not in asked:  # (an unfetched URL: refused)
            return None
        asked["log_id"] = getattr(request, "logId", None) or None  # (layout_parsing's request has none)
        data = asked.get("data") or _decoded("file", request.file)
        settings = gateway.settings
        if len(data) > settings.max_pdf_bytes:
            raise InvalidInput(f"file: the PDF is {len(data) / 2 ** 20:.1f} MiB; send one of at most "
                               f"{settings.max_pdf_bytes / 2 ** 20:.0f} MiB (--max-pdf-bytes), or split it")
        return await asyncio.to_thread(_rendered, data, settings.max_pdf_pages)
    except ServiceError as exc:  # (before the gateway reads a page: counted here)
        gateway.refuse(exc)
        raise


def _rendered(data: bytes, max_pages: int):
    import cv2
    import pypdfium2
    from paddlex.inference.serving.infra import utils
    from paddlex.inference.utils.pdfium_lock import pdfium_lock

    try:
        with pdfium_lock:
            document = pypdfium2.PdfDocument(data)
            try:
                count = len(document)
            finally:
                document.close()
    except pypdfium2.PdfiumError as exc:
        raise InvalidInput(f"Invalid input file: not a PDF pypdfium2 can open ({len(data)} bytes, starting "
                           f"{data[:8]!r}: {str(exc)[:80]}); send a PDF file's bytes, or fileType 1 for an image") from None
    if count > max_pages:
        raise InvalidInput(f"file: the PDF has {count} pages; send one of at most {max_pages} pages "
                           "(--max-pdf-pages), or split it")
    if count == 0:
        raise InvalidInput("file: the PDF has no page; send one with a page or more")
    try:
        images, info = utils.read_pdf(data)
    except utils.ImageTooLargeError as exc:
        raise InvalidInput(f"file: {exc}; send pages of fewer pixels") from None
    pages = [cv2.imencode(".png", image, [cv2.IMWRITE_PNG_COMPRESSION, 1])[1].tobytes() for image in images]
    return pages, info


def _parse(schemas, body: bytes):
    """The body as PaddleX's ``InferRequest``; its validation errors as PaddleX words them (a JSON list of
    ``{type, loc, msg}``, without the input), answered 422."""
    import pydantic

    try:
        return schemas.InferRequest.model_validate_json(body)
    except pydantic.ValidationError as exc:
        errors = [{"type": e["type"], "loc": ".".join(str(p) for p in ("body", *e["loc"])), "msg": e["msg"]}
                  for e in exc.errors()[:10]]
        raise InvalidInput(json.dumps(errors)) from None


def _served(gateway: Gateway, kinds: tuple[str, ...]) -> tuple[str, dict[str, Any]] | None:
    """The served PaddleX pipeline of one of ``kinds`` (their ``pipeline_name``): its name and settings; None
    where none is. Refused where several are: which one a path answers would be a guess."""
    found = [(m.name, m.config["paddlex"]) for m in gateway.catalog.models.values()
             if (m.config.get("paddlex") or {}).get("pipeline_name") in kinds]
    if len(found) > 1:
        raise InvalidInput(f"several PaddleX {' or '.join(kinds)} pipelines are served ({', '.join(n for n, _ in found)}): "
                           "call one with the Open Inference Protocol, /v2/models/<name>/infer")
    return found[0] if found else None


def _settings(request, about: dict[str, Any]) -> dict[str, Any]:
    """The request's settings as the pipeline's parameters, each field under the name PaddleX serving hands it
    to ``pipeline.predict`` under (``textDetThresh`` -> ``text_det_thresh``), checked as v2's are (a mapping
    or a list as its JSON text, as a parameter is a single value); a setting the pipeline does not take
    refused, naming it."""
    found = {}
    for key, value in request:
        if key in settings_of.NOT_SETTINGS or value is None:
            continue
        name = settings_of.setting_name(key)
        if name not in about["settings"]:
            raise InvalidInput(f"{key}: not a setting of the served PaddleX {about['pipeline_name']} pipeline; leave it "
                               "out")
        given = json.dumps(value) if isinstance(value, (dict, list)) else value
        try:
            settings_of.settings(about["settings"], {name: given})
        except InvalidInput as exc:
            raise InvalidInput(f"{key}: {exc}") from None
        found[name] = given
    return found


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _file(request) -> bytes:
    """A document request's file (an image: a PDF is read before, ``_pdf_pages``); no type refused."""
    if not _is_url(request.file) and request.fileType is None:
        raise InvalidInput("File type cannot be determined: send fileType 1 (an image) or 0 (a PDF)")
    return _decoded("file", request.file)


def _decoded(field: str, text: str) -> bytes:
    """A request's file in ``field``, from base64; a URL (unless ``--fetch-urls`` fetched it) refused."""
    if _is_url(text):
        raise InvalidInput(f"{field}: URLs are not fetched (a client could make the service fetch any address); "
                           "send the file's bytes in base64, or start the service with --fetch-urls")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"Invalid input file: {field} is not base64 (it starts {text[:16]!r}); send the "
                           f"{'CSV' if field == 'csv' else 'image'} file's bytes in base64") from None


async def _fetched(body: bytes, field: str, gateway: Gateway) -> bytes | None:
    """With ``--fetch-urls``, the bytes at a request's http(s) URL in ``field`` (within the body limit); None
    for any other request (``identify`` reads it, and refuses a URL)."""
    if not gateway.settings.fetch_urls or b'"http' not in body:
        return None
    try:
        text = json.loads(body).get(field)
    except (ValueError, AttributeError):
        return None
    if not isinstance(text, str) or not _is_url(text):
        return None
    return await asyncio.to_thread(_fetch, text, gateway.settings.max_body_bytes)


def _fetch(url: str, limit: int) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - http(s) only, asked for
            data = answer.read(limit + 1)
    except Exception as exc:  # noqa: BLE001 - any failure to fetch is the client's URL's
        raise InvalidInput(f"Invalid input file: fetching {url[:80]!r} failed: {type(exc).__name__}") from None
    if len(data) > limit:
        raise InvalidInput(f"Invalid input file: {url[:80]!r} is over the body limit ({limit} bytes)")
    return data


def _result(outputs) -> Any:
    return json.loads(outputs["result"][0])


def _documents(schemas, models, utils, pages, info, log_id):
    """PaddleX serving's result for a document pipeline (OCR, PP-StructureV3, tables, seals, formulas, the
    document preprocessor): a result a page in its InferResult's one list (``ocrResults``,
    ``layoutParsingResults``, ...), each its ``prunedResult`` (PaddleX's result, as PaddleX serving prunes it),
    with what else its app's schema asks that the pipeline answers (``markdown``; the corrected page,
    ``outputImage``, encoded by PaddleX serving's own ``postprocess_image``), and the file's ``dataInfo``."""
    (field, annotation), = ((k, f.annotation) for k, f in schemas.InferResult.model_fields.items() if k != "dataInfo")
    item = typing.get_args(annotation)[0]
    found = []
    for outputs in pages:
        entry = {"prunedResult": _result(outputs)}
        if "markdown" in item.model_fields:
            entry["markdown"] = json.loads(outputs["markdown"][0])
        if "outputImage" in item.model_fields:
            from paddlex.inference.serving.basic_serving._pipeline_apps._common.common import postprocess_image

            entry["outputImage"] = postprocess_image(np.asarray(outputs["output_img"])[0], log_id, "output_img.png")
        found.append(item(**entry))
    return schemas.InferResult(**{field: found, "dataInfo": info})


def _classification_result(schemas, models, utils, pages, info, log_id):
    """PaddleX serving's categories: each class's id, name and score, best first (from the typed outputs:
    PaddleX's result holds an image's ids as its batch's array)."""
    outputs, = pages
    return schemas.InferResult(categories=[
        {"id": int(i), "name": name.decode("utf-8", "replace"), "score": float(score)}
        for i, name, score in zip(outputs["class_ids"], outputs["label_names"], outputs["scores"])])


def _detection_result(schemas, models, utils, pages, info, log_id):
    """PaddleX serving's detected objects: each box's coordinates, class id and name, score."""
    outputs, = pages
    return schemas.InferResult(detectedObjects=[
        {"bbox": box["coordinate"], "categoryId": box["cls_id"], "categoryName": box["label"], "score": box["score"]}
        for box in _result(outputs).get("boxes") or []])


def _instances_result(schemas, models, utils, pages, info, log_id):
    """PaddleX serving's instances: each box's coordinates, class id and name, score, and its mask (PaddleX's
    result holds it cut to the box) run-length encoded by PaddleX serving's own ``_rle``."""
    from paddlex.inference.serving.basic_serving._pipeline_apps.instance_segmentation import _rle

    outputs, = pages
    found = _result(outputs)
    instances = []
    for box, mask in zip(found.get("boxes") or [], found.get("masks") or []):
        mask = np.asarray(mask, dtype=np.uint8)
        if mask.ndim != 2:  # a box under a pixel high: its mask's JSON is [], its width lost
            mask = mask.reshape(0, 0)
        instances.append({"bbox": box["coordinate"], "categoryId": box["cls_id"], "categoryName": box["label"],
                          "score": box["score"], "mask": {"rleResult": _rle(mask), "size": list(mask.shape)}})
    return schemas.InferResult(instances=instances)


def _segmentation_result(schemas, models, utils, pages, info, log_id):
    """PaddleX serving's class map: each pixel's class, row by row, and the map's [height, width] (from the typed
    output ``pred``); no image (``visualize`` draws nothing)."""
    outputs, = pages
    classes = np.asarray(outputs["pred"])[0]
    return schemas.InferResult(labelMap=classes.reshape(-1).tolist(), size=list(classes.shape), image=None)


def _forecast_result(schemas, models, utils, pages, info, log_id):
    """PaddleX serving's forecast: the pipeline's forecast as CSV (its app's ``data_frame_to_bytes``), base64; no
    chart (``visualize`` draws nothing)."""
    outputs, = pages
    return schemas.InferResult(csv=utils.base64_encode(outputs["forecast"][0]), image=None)


def _document(path: str, pipelines: tuple[str, ...], what: str) -> Endpoint:
    """The endpoint of PaddleX serving's app for a document pipeline: a file (an image, or a PDF read page by
    page) and the pipeline's settings."""
    return Endpoint(path, pipelines, "file", _file, _documents, f"{what} (PaddleX serving's API)",
                    f"PaddleX serving's {what} API for a PaddleX {' or '.join(pipelines)} pipeline file the "
                    'repository serves: a JSON body {"file": "<base64 image or PDF>", "fileType": 1 (0: a PDF)}',
                    "a body that is not PaddleX's request, a file that is not an image or PDF, a URL, a PDF over "
                    "the limits, a setting of the wrong kind", pdf=True)


def _image(path: str, pipeline: str, what: str, result: Callable[..., Any], setting: str, refused: str) -> Endpoint:
    """The endpoint of PaddleX serving's app for a single-image pipeline: an image (``image``, no PDF) and
    one setting (``setting``: its JSON, as the API's description shows it; ``refused``: its bad values)."""
    return Endpoint(path, (pipeline,), "image", lambda request: _decoded("image", request.image), result,
                    f"{what[0].upper()}{what[1:]} (PaddleX serving's API)",
                    f"PaddleX serving's {what} API for a PaddleX {pipeline} pipeline file the repository serves: a "
                    f'JSON body {{"image": "<base64 image>", {setting}}}',
                    f"a body that is not PaddleX's request, an image that is not one, a URL, {refused}")


ENDPOINTS = (
    _document("/ocr", ("OCR",), "OCR"),
    _document("/layout-parsing", ("PP-StructureV3", "layout_parsing"), "layout parsing"),
    _document("/table-recognition", ("table_recognition_v2", "table_recognition"), "table recognition"),
    _document("/seal-recognition", ("seal_recognition",), "seal recognition"),
    _document("/formula-recognition", ("formula_recognition",), "formula recognition"),
    _document("/document-preprocessing", ("doc_preprocessor",), "document preprocessing"),
    _image("/image-classification", "image_classification", "image classification", _classification_result,
           '"topk": 5', "a topk that is not a whole number"),
    _image("/multilabel-image-classification", "image_multilabel_classification",
           "multi-label image classification", _classification_result, '"threshold": 0.5',
           "a threshold that is not a number, a mapping or a list"),
    _image("/object-detection", "object_detection", "object detection", _detection_result, '"threshold": 0.5',
           "a threshold that is not a number or a mapping"),
    _image("/small-object-detection", "small_object_detection", "small object detection", _detection_result,
           '"threshold": 0.5', "a threshold that is not a number or a mapping"),
    _image("/instance-segmentation", "instance_segmentation", "instance segmentation", _instances_result,
           '"threshold": 0.5', "a threshold that is not a number"),
    _image("/semantic-segmentation", "semantic_segmentation", "semantic segmentation", _segmentation_result,
           '"targetSize": -1', "a targetSize that is not a whole number or a [width, height]"),
    Endpoint("/time-series-forecasting", ("ts_forecast",), "csv", lambda request: _decoded("csv", request.csv),
             _forecast_result, "Time-series forecasting (PaddleX serving's API)",
             "PaddleX serving's time-series forecasting API for a PaddleX ts_forecast pipeline file the repository "
             'serves: a JSON body {"csv": "<base64 CSV>"}',
             "a body that is not PaddleX's request, a CSV pandas cannot read or the model cannot take (too short, "
             "without its columns), a URL", given="csv"),
)
assert {e.path for e in ENDPOINTS} == PADDLEX_PATHS


def _route(endpoint: Endpoint) -> InferRoute:
    async def handle(gateway: Gateway, call: Call) -> Response:
        return await serve(endpoint, gateway, call)

    handle.__name__ = endpoint.path.strip("/").replace("-", "_")  # FastAPI's operationId starts with it
    return InferRoute(endpoint.path, handle, summary=endpoint.summary, about=endpoint.about, responses={
        404: {"description": f"no PaddleX {' or '.join(endpoint.pipelines)} pipeline is served"},
        422: {"description": f"PaddleX's error shape {{logId, errorCode, errorMsg}}: {endpoint.refused}"},
        500: {"description": "the pipeline failed on this request"},
        503: {"description": "overloaded, shutting down or not ready; see Retry-After"},
        504: {"description": "not answered within the request timeout"},
    })


ROUTES = tuple(_route(endpoint) for endpoint in ENDPOINTS)
