"""An encoded image as PaddleX's pipelines read it (models/paddlex_pipeline.decoded): a header that claims more
pixels than ``MAX_DECODED_PIXELS`` is refused from the header alone, before OpenCV allocates what it
claims; a 12-megapixel photo decodes."""

from __future__ import annotations

import re
import struct
import zlib

import cv2
import numpy as np
import pytest

from placeenv.serve.models import paddlex_pipeline
from placeenv.serve.models.base import InputError


def claiming(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims ``width`` x ``height`` pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def _decoded(data: bytes) -> np.ndarray:
    return paddlex_pipeline.decoded({"image": np.array([data], dtype=object)})


@pytest.mark.parametrize("width, height, says", [
    (9000, 9000, "its header claims 81 million pixels (69 bytes); send an image of at most 64 million pixels"),
    (60000, 60000, "its header claims over 179 million pixels"),  # over Pillow's own bomb limit
])
def test_a_header_claiming_too_many_pixels_is_refused_before_decoding(width, height, says):
    with pytest.raises(InputError, match=re.escape(says)):
        _decoded(claiming(width, height))


def test_the_limit_is_what_refuses_and_a_photo_decodes(monkeypatch):
    photo = cv2.imencode(".jpg", np.full((3000, 4000, 3), 128, np.uint8))[1].tobytes()
    assert _decoded(photo).shape == (3000, 4000, 3)
    # The control: past the limit the same header reaches OpenCV, which finds no such image in 69 bytes.
    monkeypatch.setattr(paddlex_pipeline, "MAX_DECODED_PIXELS", 10_000 * 10_000)
    with pytest.raises(InputError, match="not an image OpenCV can decode"):
        _decoded(claiming(9000, 9000))
