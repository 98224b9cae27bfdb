"""The request path's shortcuts give the answers of the slow ways they replace."""

from __future__ import annotations

import asyncio
import json

import pytest
from paddle.base import core

import placeenv
from service.fastjson import FastJSONRequest

BODIES = [
    b'{"model": "digits", "inputs": [[0, 1.5, -0.0, 1e400]]}',
    b'{"a": NaN, "b": Infinity, "c": -Infinity}',
    b'{"a": 123456789012345678901234567890, "a": 2}',
    b'"\\ud800"',  # a lone surrogate: pydantic-core refuses it, json.loads takes it
    '{"é": "ü"}'.encode("utf-16"),  # json.loads detects UTF-16; pydantic-core reads UTF-8 only
    b"[" * 300 + b"]" * 300,  # deeper than pydantic-core's limit
]
INVALID = [b"{", b'{"a": 1} trailing', b"\xff\xfe\x00", b"[" * 5000 + b"]" * 5000, b'{"a": nan}']


def _parse(body: bytes):
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    request = FastJSONRequest({"type": "http", "method": "POST", "headers": []}, receive)
    return asyncio.run(request.json())


def _outcome(parse, body):
    try:
        return "value", repr(parse(body))
    except Exception as exc:  # noqa: BLE001 - the type and message are what is compared
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("body", BODIES + INVALID)
def test_fast_json_body_parses_exactly_as_json_loads(body):
    assert _outcome(_parse, body) == _outcome(json.loads, body)


def test_device_name_cache_follows_a_place_object_that_changes():
    place = core.Place()
    place.set_place(core.CPUPlace())
    assert placeenv.device_name(place) == "cpu"
    place.set_place(core.CustomPlace("sim", 1))  # the cache keyed a copy, not this object
    assert placeenv.device_name(place) == "sim:1"
    assert placeenv.device_name(core.CustomPlace("sim", 3)) == "sim:3"
    assert placeenv.device_name(core.CPUPlace()) == "cpu"
