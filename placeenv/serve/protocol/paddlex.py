"""A PaddleX pipeline's per-request settings, and the size an image's header claims.

A served PaddleX pipeline takes, as a request's parameters, the settings its pipeline object's ``predict``
takes, under the same names (``text_det_thresh``, ``use_textline_orientation``, ``threshold``, ...). Each
has a kind read from ``predict``'s own annotations when the pipeline file is read (``kind_of``); a request's
value is checked against it here, so a wrong one is the request's 400 naming it, and what PaddleX does with
a value of the right kind is PaddleX's. Parameters are single values (v2's and gRPC's): a setting that takes
a mapping or a list (a per-class ``threshold``, ``markdown_ignore_labels``) is sent as its JSON text.

No Paddle, no PaddleX: a front end checks them too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from .errors import InvalidInput
from .wire import prefix

#: The kinds of setting, and what a request sends for each.
KINDS = {"bool": "true or false", "int": "a whole number", "number": "a number",
         "str": "a string", "json": "a number, or a JSON object or list as text",
         "text": "a number, a string, or a JSON object or list as text"}
#: The fields of PaddleX serving's requests that are not the pipeline's settings (the file, its type, ...).
NOT_SETTINGS = frozenset({"file", "fileType", "image", "csv", "visualize", "logId"})
#: Whole-number settings that size an image PaddleX makes (a page resized to it), bounded: within them PaddleX
#: decides, past them a request could make it allocate without bound.
SIDES = {"limit_side_len": (0, 100_000), "max_side_limit": (1, 100_000)}
#: String settings with a few values, by the end of their names: PaddleX raises, not refuses, on another.
CHOICES = {"limit_type": ("min", "max", "resize_long", "")}


def setting_name(field: str) -> str:
    """The name under which PaddleX serving hands a request's field to ``pipeline.predict``:
    ``textDetThresh`` -> ``text_det_thresh``."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", field).lower()


def kind_of(annotation: str) -> str:
    """A setting's kind from its annotation in ``predict`` (its text: ``Optional[float]``,
    ``Union[float, dict]``, ...)."""
    text = annotation.replace("typing.", "").replace("NoneType", "None")
    for wrapper in ("Optional[", "Union["):
        if text.startswith(wrapper) and text.endswith("]"):
            text = text[len(wrapper):-1]
    parts = {part.strip() for part in text.split(",")} - {"None", ""}
    if parts == {"bool"}:
        return "bool"
    if parts == {"int"}:
        return "int"
    if parts <= {"int", "float"} and parts:
        return "number"
    if parts == {"str"}:
        return "str"
    return "text" if "str" in parts or not parts else "json"


def settings(table: Mapping[str, str], parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A request's ``parameters`` as the keyword arguments of the pipeline's ``predict`` (``table``: each
    setting's kind). ``InvalidInput`` naming the first that the pipeline does not take, or whose value is not
    of its kind."""
    found = {}
    for key, value in parameters.items():
        kind = table.get(key)
        if kind is None:
            raise InvalidInput(f"parameter {key!r}: not a setting of this PaddleX pipeline; it takes "
                               f"{', '.join(sorted(table)) or 'none'} (PaddleX's pipeline.predict names)")
        found[key] = _checked(key, kind, value)
    return found


def _checked(key: str, kind: str, value: Any) -> Any:
    ok = {"bool": type(value) is bool, "int": type(value) is int,
          "number": type(value) in (int, float) and math.isfinite(value), "str": type(value) is str,
          "json": type(value) in (int, float) or type(value) is str and value[:1] in ("{", "["),
          "text": type(value) in (int, float, str, bool)}[kind]
    if not ok:
        raise InvalidInput(f"parameter {key} {prefix(value)}: send {KINDS[kind]}")
    for suffix, (low, high) in SIDES.items():
        if key.endswith(suffix) and kind == "int" and not low <= value <= high:
            raise InvalidInput(f"parameter {key} {prefix(value)}: send a whole number from {low} to {high}")
    for suffix, values in CHOICES.items():
        if key.endswith(suffix) and kind == "str" and value not in values:
            raise InvalidInput(f"parameter {key} {prefix(value)}: send one of {', '.join(v for v in values if v)} "
                               "(\"\": the pipeline file's)")
    if kind in ("json", "text") and type(value) is str and value[:1] in ("{", "["):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidInput(f"parameter {key} {prefix(value)}: not JSON; send a JSON object or list as text, "
                               'such as {"0": 0.5}') from None
        if isinstance(value, dict):  # PaddleX's per-class mappings are keyed by class id
            value = {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in value.items()}
    return value


def claimed_size(blob: bytes) -> tuple[int, int] | None:
    """The width and height an encoded image's header claims, read by Pillow without decoding a pixel; (0, 0)
    for a file Pillow does not know (OpenCV then says what it is), None for one over Pillow's own bomb limit."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(blob)) as image:
            return image.size
    except Image.DecompressionBombError:
        return None
    except Exception:  # noqa: BLE001 - a file Pillow cannot read
        return 0, 0
