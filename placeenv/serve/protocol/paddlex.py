"""A PaddleX pipeline's per-request settings: their names (those of PaddleX's ``pipeline.predict``), their
checks, and how a request's value meets the pipeline file's: OCR's (``SETTINGS``, ``SWITCHES``; the
document preprocessor's two switches as PaddleX's OCR pipeline combines them, ``doc_preprocessing``),
image classification's ``topk`` and object detection's ``threshold``; and the size an image's header
claims (``claimed_size``, Pillow's reading). The pipelines' CPU steps read them from a request's
parameters (models/paddlex_ocr.py, paddlex_classification.py, paddlex_detection.py); PaddleX serving's
endpoints map its fields to them and show them in their answers (http/paddlex.py). No Paddle, no
PaddleX: a front end checks them too.

PaddleX's quirk, copied: its text detector takes ``value or default``, so a falsy limit side length,
limit type, threshold, box threshold or unclip ratio (0, "") runs with the pipeline file's value, while
the answer's ``text_det_params`` shows the value sent. The max side limit and the score threshold are
taken as sent (PaddleX tests those against None).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .errors import InvalidInput
from .wire import prefix

#: Each request parameter -> the pipeline file's group and setting it overrides.
SETTINGS = {"text_det_limit_side_len": ("detection", "limit_side_len"),
            "text_det_limit_type": ("detection", "limit_type"),
            "text_det_max_side_limit": ("detection", "max_side_limit"),
            "text_det_thresh": ("detection", "thresh"), "text_det_box_thresh": ("detection", "box_thresh"),
            "text_det_unclip_ratio": ("detection", "unclip_ratio"),
            "text_rec_score_thresh": ("recognition", "score_thresh")}
#: The settings PaddleX takes as ``value or default`` (the quirk above).
OR_DEFAULT = frozenset({"text_det_limit_side_len", "text_det_limit_type", "text_det_thresh",
                        "text_det_box_thresh", "text_det_unclip_ratio"})
#: Whole-number settings and their bounds; number settings (an int or a float) and theirs.
WHOLE = {"text_det_limit_side_len": (0, 100_000), "text_det_max_side_limit": (1, 100_000)}
NUMBER = {"text_det_thresh": (0.0, 1.0), "text_det_box_thresh": (0.0, 1.0), "text_det_unclip_ratio": (0.0, 10.0),
          "text_rec_score_thresh": (0.0, 1.0)}
LIMIT_TYPES = ("min", "max", "resize_long")
#: The modules a request turns on or off (true or false; left out, the pipeline file's choice).
SWITCHES = ("use_textline_orientation", "use_doc_orientation_classify", "use_doc_unwarping")
#: The most classes an image classification answer lists (a bound of ours: PaddleX takes any above 0).
TOPK_MAX = 100_000
#: The document preprocessor's switches, as PaddleX's ``pipeline.predict`` names them.
DOC_SWITCHES = ("use_doc_orientation_classify", "use_doc_unwarping")


def _check(key: str, value: Any) -> None:
    """``InvalidInput`` naming ``key`` unless ``value`` is what PaddleX takes for it."""
    kind = type(value)
    if key in SWITCHES:
        if kind is not bool:
            raise InvalidInput(f"parameter {key} {prefix(value)}: send true or false (left out: the pipeline "
                               "file's choice)")
        return
    if key == "text_det_limit_type":
        if kind is not str or value not in (*LIMIT_TYPES, ""):
            raise InvalidInput(f"parameter {key} {prefix(value)}: send one of {', '.join(LIMIT_TYPES)} (\"\": the "
                               "pipeline file's limit_type)")
        return
    low, high = WHOLE.get(key) or NUMBER[key]
    number = kind is int or (kind is float and key in NUMBER and math.isfinite(value))
    if not number or not low <= value <= high:
        what = "a whole number" if key in WHOLE else "a number"
        default = f" (0: the pipeline file's {SETTINGS[key][1]})" if key in OR_DEFAULT else ""
        raise InvalidInput(f"parameter {key} {prefix(value)}: send {what} from {low} to {high}{default}")


def requested(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The OCR settings among a request's ``parameters``, checked (``InvalidInput`` naming the first bad
    one); the other parameters are not the OCR's, and left alone."""
    found = {key: value for key, value in parameters.items() if key in SETTINGS or key in SWITCHES}
    for key, value in found.items():
        _check(key, value)
    return found


def used(detection: Mapping[str, Any], recognition: Mapping[str, Any],
         parameters: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The detection and recognition settings a request runs with: the pipeline file's (``detection``,
    ``recognition``) with the request's overrides, as PaddleX takes them (a falsy ``OR_DEFAULT`` value
    is the file's). A request without them gets the file's own mappings, as they are."""
    if not parameters:
        return detection, recognition
    groups = {"detection": dict(detection), "recognition": dict(recognition)}
    for key, value in requested(parameters).items():
        if key in SWITCHES or (key in OR_DEFAULT and not value):
            continue
        group, setting = SETTINGS[key]
        groups[group][setting] = value
    return groups["detection"], groups["recognition"]


def textline_orientation(served: bool, parameters: Mapping[str, Any]) -> bool:
    """Whether a request's lines are classified: its ``use_textline_orientation`` where it sends one, else
    the file's (``served``: the file turns it on exactly where it gives the model). ``InvalidInput`` where
    it asks for it from a pipeline without the model."""
    value = parameters.get("use_textline_orientation")
    if value and not served:
        raise InvalidInput("parameter use_textline_orientation true: this pipeline has no text-line orientation "
                           "model (its file turns use_textline_orientation off, or gives no TextLineOrientation "
                           "SubModule); send false or leave it out")
    return served if value is None else value


def shown(detection: Mapping[str, Any], recognition: Mapping[str, Any],
          parameters: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """What PaddleX's answer shows of them: ``text_det_params`` and ``text_rec_score_thresh``, each the
    value sent, else the file's (a falsy ``OR_DEFAULT`` value shown as sent, as PaddleX shows it)."""
    values = {"detection": dict(detection), "recognition": dict(recognition)}
    for key, value in parameters.items():
        if key in SETTINGS and value is not None:
            group, setting = SETTINGS[key]
            values[group][setting] = value
    det = values["detection"]
    params = {key: det[key] for key in ("limit_side_len", "limit_type", "thresh", "max_side_limit", "box_thresh",
                                        "unclip_ratio")}
    return params, values["recognition"]["score_thresh"]


def doc_preprocessing(doc: Mapping[str, bool] | None, parameters: Mapping[str, Any]) -> dict[str, bool] | None:
    """The document preprocessor's switches for a request, as PaddleX's OCR pipeline sets them: a request
    that sends neither switch gets the file's (``doc``, None where the file turns the preprocessor off);
    one that sends either runs it exactly where one is true, the other the file's where left out. None
    where it does not run. ``InvalidInput`` naming the switch where the request asks for a module the
    pipeline has no model for (PaddleX logs an error and answers nothing useful)."""
    sent = {key: parameters.get(key) for key in DOC_SWITCHES}
    if all(value is None for value in sent.values()):
        return dict(doc) if doc is not None else None
    if not any(value is True for value in sent.values()):
        return None
    for key, value in sent.items():
        if value and not (doc or {}).get(key):
            what = "has no document preprocessor" if doc is None else f"turns {key} off"
            raise InvalidInput(f"parameter {key} true: this pipeline's file {what}, so it has no model for it; "
                               "send false or leave it out")
    return {key: doc[key] if value is None else value for key, value in sent.items()}


def topk(parameters: Mapping[str, Any]) -> int | None:
    """An image classification request's ``topk`` (how many classes its answer lists), checked; None
    where it sends none (the pipeline's own)."""
    value = parameters.get("topk")
    if value is not None and (type(value) is not int or not 1 <= value <= TOPK_MAX):
        raise InvalidInput(f"parameter topk {prefix(value)}: send a whole number from 1 to {TOPK_MAX} (left out: the "
                           "pipeline file's topk, else its model's)")
    return value


def threshold(parameters: Mapping[str, Any]) -> float | dict[int, float] | None:
    """An object detection request's ``threshold`` (the score a box must pass), checked: a number from 0 to
    1, or per class a JSON object of class id -> such a number (PaddleX's dict: a class it leaves out, or
    any class of an empty one, passes at 0.5), as the float or dict PaddleX's postprocess takes. None
    where it sends none (the pipeline's own)."""
    value = parameters.get("threshold")
    if value is None:
        return None
    if type(value) is str:
        try:
            given = json.loads(value)
            value = {int(key): given[key] for key in given} if isinstance(given, dict) else None
        except (ValueError, TypeError):
            value = None
    if isinstance(value, dict) and all(is_score(v) for v in value.values()):
        return {int(key): float(v) for key, v in value.items()}
    if not isinstance(value, dict) and is_score(value):
        return float(value)  # (PaddleX's postprocess filters only by a float: an int 1 would pass every box)
    raise InvalidInput(f"parameter threshold {prefix(value if value is not None else parameters['threshold'])}: send "
                       'a number from 0 to 1, or per class a JSON object such as {"0": 0.5, "2": 0.7} (left out: '
                       "the pipeline file's threshold, else its model's)")


def is_score(value: Any) -> bool:
    """Whether ``value`` is a number from 0 to 1 (not a bool)."""
    return type(value) in (int, float) and math.isfinite(value) and 0 <= value <= 1


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
