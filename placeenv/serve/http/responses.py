"""The service's one JSON renderer, and the answer every HTTP API gives a ``ServiceError``."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pydantic_core
from fastapi import Response
from fastapi.responses import JSONResponse
from fastapi.encoders import jsonable_encoder

from ..protocol.errors import ServiceError, outcome
from ..protocol.wire import prefix


def render_json(content: Any) -> bytes:
    """The service's JSON: pydantic-core's serializer (faster than ``json.dumps``; floats round-trip
    exactly), non-finite floats as the strings "NaN"/"Infinity". A lone surrogate, which UTF-8
    cannot encode (a client's string quoted in an error), is escaped as ``json.dumps`` escapes it."""
    try:
        return pydantic_core.to_json(content, inf_nan_mode="strings")
    except pydantic_core.PydanticSerializationError:
        return json.dumps(_json_safe(content), ensure_ascii=True, allow_nan=False,
                          separators=(",", ":")).encode("ascii")


def _json_safe(value: Any) -> Any:
    """Non-finite floats as the strings pydantic-core writes for them; the rest as is."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


class JSON(JSONResponse):
    """Every JSON answer of the service, FastAPI's own included (the app's default response class; a
    ``JSONResponse``, so the OpenAPI documentation shows each route's response schema)."""

    def render(self, content: Any) -> bytes:
        return render_json(content)


def validation_detail(errors: list[dict]) -> list[dict]:
    """pydantic's errors as a 422's ``detail``: FastAPI's list, with each client-sent key and input cut
    to a prefix and only the first 10 (a body of many unknown keys cannot make a huge answer)."""
    found = [{**e, "loc": [p if not isinstance(p, str) or len(p) <= 40 else prefix(p) for p in e["loc"]],
              **({"input": prefix(e["input"])} if "input" in e else {})} for e in errors[:10]]
    return jsonable_encoder(found)


def error_key(path: str) -> str:
    """The key of an error answer: the Open Inference Protocol's "error" under /v2, FastAPI's "detail" elsewhere."""
    return "error" if path.startswith("/v2") else "detail"


#: The paths of PaddleX serving's API (http/paddlex.py), whose errors are its shape.
PADDLEX_PATHS = frozenset({"/ocr", "/layout-parsing", "/table-recognition", "/seal-recognition",
                           "/formula-recognition", "/document-preprocessing", "/image-classification",
                           "/multilabel-image-classification", "/object-detection", "/small-object-detection",
                           "/instance-segmentation", "/semantic-segmentation",
                           "/time-series-forecasting"})


def error_body(path: str, detail: Any, status: int, log_id: str | None = None) -> dict[str, Any]:
    """Every error answer's body, in its API's shape: ``{key: detail}`` (``error_key``), or for PaddleX
    serving's paths its ``{logId, errorCode, errorMsg}``, the status as ``errorCode`` and ``log_id`` (the
    request's, where it gave one) as ``logId``."""
    if path in PADDLEX_PATHS:
        return {"logId": log_id or str(uuid.uuid4()), "errorCode": status,
                "errorMsg": detail if isinstance(detail, str) else json.dumps(jsonable_encoder(detail))}
    return {error_key(path): detail}


def refusal(exc: ServiceError, path: str, retry_after_s: int, log_id: str | None = None) -> Response:
    """Every API's answer to a domain error: one table (errors.OUTCOMES), each API's error shape
    (``error_body``). PaddleX serving answers 422 for what it cannot read, where the table says 400."""
    found = outcome(exc)
    status = 422 if found.status == 400 and path in PADDLEX_PATHS else found.status
    headers = {"Retry-After": str(retry_after_s)} if found.retry else None
    if found.allow:
        headers = {**(headers or {}), "Allow": exc.allow}
    return JSON(error_body(path, exc.detail, status, log_id), status_code=status, headers=headers)
