"""Encoded images (PNG, JPEG) as a model's ``preprocess`` takes them: BYTES elements decoded with Pillow
into float arrays, each refused with a clear ``InputError`` that quotes none of its bytes.

    from placeenv.serve.models.images import decode_all
    pixels = decode_all(inputs["image"], "image", mode="RGB", size=(32, 32))   # [n, 3, 32, 32] in [0, 1]
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..protocol.request import InputError

#: The formats a client may send.
FORMATS = ("PNG", "JPEG")
#: The largest image decoded, in pixels a side: a header may claim any size, and decoding what it
#: claims costs memory and time before anything could check it.
MAX_SIDE = 4096


def decode(data: bytes, where: str, mode: str, size: tuple[int, int]) -> np.ndarray:
    """One PNG or JPEG as a float32 array ``[channels, height, width]`` in [0, 1], resized to ``size``
    (width, height) with bilinear filtering; ``mode`` is Pillow's ("RGB", "L"). ``where`` names the
    element in a refusal (``input 'image' element 3``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            width, height = image.size
            if width > MAX_SIDE or height > MAX_SIDE:
                raise InputError(f"{where} is {width}x{height} pixels; at most {MAX_SIDE} a side")
            if image.format == "JPEG":
                image.draft(mode, size)  # decode at the smallest scale still at least ``size``: far less work
            image = image.convert(mode).resize(size, Image.Resampling.BILINEAR)
    except InputError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise InputError(f"{where} is not a {' or '.join(FORMATS)} image of at most {MAX_SIDE} pixels a side "
                         f"({len(data)} bytes); send the file's bytes as they are") from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data past a valid header
        raise InputError(f"{where} cannot be decoded ({type(exc).__name__}; {len(data)} bytes): send a whole "
                         f"{' or '.join(FORMATS)} file") from None
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def decode_all(images: np.ndarray, name: str, mode: str, size: tuple[int, int]) -> np.ndarray:
    """Every element of a BYTES input ``name`` decoded (``decode``), as one array ``[n, channels, h, w]``."""
    return np.stack([decode(data, f"input {name!r} element {i}", mode, size) for i, data in enumerate(images.flat)])


def encode(pixels: np.ndarray, format: str = "PNG", **options) -> bytes:
    """A uint8 array (``[h, w]`` or ``[h, w, 3]``) as an encoded image: what a client sends."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=format, **options)
    return out.getvalue()
