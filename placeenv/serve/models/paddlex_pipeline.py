"""PaddleX's own pipeline object on the CPU workers, its networks on the devices: the one seam.

Every PaddleX vision predictor runs its network through one object, ``self.runner``: a
``list[np.ndarray]`` in (ordered by the export's sorted input names), a ``list[np.ndarray]`` out (in
the export's output order). PaddleX builds it through an inference engine; ``ServiceEngine`` is one
(``ENGINE``, registered with PaddleX when this module first builds a pipeline), whose ``Runner`` hands
each call to the engine as a call of the request being served (``Model.infer``): so PaddleX's pipeline
code (its pre- and post-processing, sub-pipelines, switches, quirks) runs as PaddleX runs it, and each
network call is a job of the export's model, batched with other requests' calls of the same shape on
the devices, with the place checks, statistics and deadlines of any job.

``PaddleXPipeline`` is the model that runs it: one PaddleX pipeline object a CPU worker (built in
``load``, so a pipeline object is only ever used by the thread that built it), one request a call of
``predict``, PaddleX's result as JSON (``result``) and, for the pipelines of ``FIELDS``, its fields as
typed outputs. PaddleX is imported only when such a model loads.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..protocol import paddlex as checks
from ..protocol.errors import ServiceError
from . import paddlex_yaml
from .base import InputError, Model, TensorSpec

#: The inference engine's name in PaddleX (``engine=`` of its ``create_pipeline``).
ENGINE = "placeenv"
#: The key of a module's ``engine_config`` that names the repository model its runner calls.
MODEL_KEY = "placeenv_model"


@dataclasses.dataclass(frozen=True)
class Link:
    """What a runner calls: the repository model, its inputs in the order PaddleX hands them (their sorted
    names), its outputs in the export's order; ``counts``: the export answers a batch's boxes in one array
    and how many are each image's (a PaddleDetection export), which its model answers a row an image
    (``per_image``) and the runner joins back."""

    model: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    counts: bool = False


@dataclasses.dataclass(frozen=True)
class _Building:
    """While a pipeline object is built on this thread: how its runners reach the engine."""

    call: Callable[[Link, list[np.ndarray]], list[np.ndarray]] | None = None
    links: Mapping[str, Link] = dataclasses.field(default_factory=dict)
    built: list | None = None  # (the module's link's model, model_name, model_dir), where a read records them


_BUILDING: contextvars.ContextVar[_Building] = contextvars.ContextVar("placeenv_paddlex_building", default=_Building())
_REGISTERED_LOCK = threading.Lock()


def _engine_class():
    """PaddleX's ``RunnerEngine`` for the service, defined once PaddleX is imported; subclassing registers it
    under ``ENGINE`` (PaddleX's ``AutoRegisterABCMetaClass``)."""
    from paddlex.inference.models.engines import RunnerEngine
    from paddlex.inference.models.runners.inference_runner import InferenceRunner

    class Runner(InferenceRunner):
        """One PaddleX predictor's network: each call a job of the repository model ``link.model``."""

        def __init__(self, link: Link, call) -> None:
            self.link, self.call = link, call

        def __call__(self, x):
            if len(x) != len(self.link.inputs):
                raise ValueError(f"{self.link.model} takes {len(self.link.inputs)} inputs "
                                 f"({', '.join(self.link.inputs)}); PaddleX's predictor gave {len(x)}")
            return self.call(self.link, [np.ascontiguousarray(a) for a in x])

        def close(self) -> None:
            pass

    class ServiceEngine(RunnerEngine):
        entities = ENGINE

        @property
        def name(self) -> str:
            return ENGINE

        def get_default_runner_builder(self):
            def build(*, model_name, model_dir, model_config, engine_config, default_builder=None):
                building = _BUILDING.get()
                link = building.links.get((engine_config or {}).get(MODEL_KEY))
                if link is None:
                    raise RuntimeError(f"{model_name} ({model_dir}) was built outside a placeenv pipeline")
                if building.built is not None:
                    building.built.append((link.model, model_name, model_dir))
                return Runner(link, building.call)

            return build

        def validate_runner(self, runner) -> None:
            pass

    return ServiceEngine


_ENGINE: list = []


def register(model_names: set[str]) -> dict[str, str]:
    """PaddleX's bindings of ``ENGINE`` for ``model_names``: each the predictor class PaddleX runs it with on
    Paddle Inference (``paddle_static``). The names that cannot be, each with why: PaddleX has no such
    model, or its network does not run through PaddleX's runner."""
    from paddlex.inference.models.bindings import register_predictor_binding_map, try_get_binding
    from paddlex.inference.models.predictors.runner_predictor import RunnerPredictor

    refused = {}
    with _REGISTERED_LOCK:
        if not _ENGINE:
            _ENGINE.append(_engine_class())
            paddlex_yaml.read_once()
        for model_name in sorted(model_names):
            if try_get_binding(model_name, ENGINE) is not None:
                continue
            binding = try_get_binding(model_name, "paddle_static")
            if binding is None:
                from paddlex.inference.models.bindings import try_get_supported_engines

                engines = try_get_supported_engines(model_name)
                refused[model_name] = ("it is no model PaddleX runs itself (a remote LLM's, or a name PaddleX does not "
                                       "know)" if engines is None else
                                       f"it has no Paddle Inference export (PaddleX runs it with {', '.join(engines)})")
            elif not issubclass(binding.predictor, RunnerPredictor):
                refused[model_name] = (f"its network runs outside PaddleX's runner ({binding.predictor.__name__})")
            else:
                register_predictor_binding_map(binding.predictor, {ENGINE: [model_name]})
    return refused


@contextlib.contextmanager
def building(links: Mapping[str, Link], call, built: list | None = None):
    """Pipeline objects built on this thread inside the block get runners over ``links`` that ``call``. The
    block may hold another's: a CPU worker waiting on a network call runs other requests' jobs meanwhile,
    another pipeline's among them, and the outer pipeline may still build a module after that one ends."""
    token = _BUILDING.set(_Building(call, links, built))
    try:
        yield
    finally:
        _BUILDING.reset(token)


def build(config: dict[str, Any], links: Mapping[str, Link], call, built: list | None = None):
    """PaddleX's own pipeline object for ``config`` (PaddleX's settings, each module's ``engine_config``
    naming its link), its networks ``call``ed through the links."""
    import copy

    from paddlex import create_pipeline

    with building(links, call, built):
        # (create_pipeline changes what it is given.)
        return create_pipeline(config=copy.deepcopy(config), engine=ENGINE, device="cpu")


def per_image(model_class: type[Model], counts: str, rows: tuple[str, ...]) -> type[Model]:
    """``model_class`` with its answers a row an image, so that requests share its forward passes: a
    PaddleDetection export answers its batch's boxes all in one ``[M, K]`` (and any other output of a row a
    box, ``rows``) and how many are each image's (``counts``, ``[N]``); each becomes ``[N, most, ...]``, each
    image's rows first, the rest -1 (the runner takes ``counts`` of them)."""

    class PerImage(model_class):
        def postprocess(self, outputs):
            found = super().postprocess(outputs)
            numbers = np.asarray(found[counts]).astype(np.int64).reshape(-1)
            starts = np.concatenate([[0], np.cumsum(numbers)])
            for name in rows:
                given = np.asarray(found[name])
                if numbers.sum() != len(given):
                    raise RuntimeError(f"the detector answered {len(given)} rows of {name}, its {counts} says "
                                       f"{int(numbers.sum())}")
                shaped = np.full((len(numbers), int(numbers.max(initial=0)), *given.shape[1:]), -1, given.dtype)
                for i, number in enumerate(numbers):
                    shaped[i, :number] = given[starts[i]:starts[i + 1]]
                found[name] = shaped
            return found

    PerImage.__name__ = PerImage.__qualname__ = f"PerImage{model_class.__name__}"
    return PerImage


def joined(link: Link, answer: list[np.ndarray]) -> list[np.ndarray]:
    """A ``counts`` export's answer as the export gives it: each image's rows (``per_image``'s) joined, its
    counts (its second output) as they are."""
    if not link.counts:
        return answer
    counts = np.asarray(answer[1]).astype(np.int64).reshape(-1)
    found = []
    for index, output in enumerate(answer):
        if index == 1:
            found.append(output)
            continue
        parts = [output[i, :n] for i, n in enumerate(counts)]
        found.append(np.concatenate(parts) if parts else output.reshape(0, *output.shape[2:]))
    return found


# -- the fields of PaddleX's results, as typed outputs -------------------------------------------------

def _rows(value, dtype, shape) -> np.ndarray:
    return np.asarray(value if value is not None else [], dtype=dtype).reshape(shape)


def _texts(values) -> np.ndarray:
    return np.array([str(v).encode() for v in np.asarray(values if values is not None else []).reshape(-1)],
                    dtype=object)


def _ocr(res: dict, result, options: dict) -> dict[str, np.ndarray]:
    polys = res.get("dt_polys", [])
    angles = res.get("textline_orientation_angles", [-1] * len(polys))
    return {"rec_texts": _texts(res.get("rec_texts")), "rec_scores": _rows(res.get("rec_scores"), np.float32, (-1,)),
            "rec_polys": _rows(res.get("rec_polys"), np.int32, (-1, 4, 2)),
            "rec_boxes": _rows(res.get("rec_boxes"), np.int32, (-1, 4)),
            "dt_polys": _rows(polys, np.int32, (-1, 4, 2)),
            "textline_orientation_angles": _rows(angles, np.int32, (-1,)),
            "doc_preprocessor_angle": _rows([(res.get("doc_preprocessor_res") or {}).get("angle", -1)], np.int32, (1,))}


def _classes(res: dict, result, options: dict) -> dict[str, np.ndarray]:
    # (PaddleX 3.7.2's classifier answers an image's ids as its batch's array: [[ids]] for one image.)
    return {"class_ids": _rows(res.get("class_ids"), np.int32, (-1,)),
            "scores": _rows(res.get("scores"), np.float32, (-1,)), "label_names": _texts(res.get("label_names"))}


def _boxes(res: dict, result, options: dict) -> dict[str, np.ndarray]:
    boxes = res.get("boxes") or []
    return {"class_ids": _rows([b["cls_id"] for b in boxes], np.int32, (-1,)),
            "scores": _rows([b["score"] for b in boxes], np.float32, (-1,)),
            "label_names": _texts([b["label"] for b in boxes]),
            "coordinates": _rows([b["coordinate"][:4] for b in boxes], np.float32, (-1, 4))}


def _page(res: dict, result, options: dict) -> dict[str, np.ndarray]:
    # The corrected page is an image of PaddleX's result, not of its JSON.
    return {"angle": _rows([res.get("angle", -1)], np.int32, (1,)),
            "output_img": np.ascontiguousarray(result["output_img"], dtype=np.uint8)[None]}


def _forecast(res: dict, result, options: dict) -> dict[str, np.ndarray]:
    # The forecast as PaddleX serving's app answers it: its DataFrame as CSV (``data_frame_to_bytes``).
    from paddlex.inference.serving.infra.utils import data_frame_to_bytes

    return {"forecast": np.array([data_frame_to_bytes(result["forecast"])], dtype=object)}


def _segments(res: dict, result, options: dict) -> dict[str, np.ndarray]:
    # Each pixel's class, from PaddleX's result itself (its JSON holds the same map as lists).
    return {"pred": _rows(result["pred"], np.int32, (1, *np.shape(result["pred"])[-2:]))}


def _markdown(res: dict, result, options: dict) -> dict[str, np.ndarray]:
    """The page as Markdown, as PaddleX serving's PP-StructureV3 app makes it (its ``MarkdownData``, as JSON):
    PaddleX's result's own ``_to_markdown``, its images encoded by PaddleX serving's own ``postprocess_images``
    (base64 JPEG) where asked, and whether the page starts and ends a paragraph."""
    from paddlex.inference.serving.basic_serving._pipeline_apps._common.common import postprocess_images
    from paddlex.inference.serving.basic_serving._pipeline_apps._common.ocr import DEFAULT_MAX_OUTPUT_IMG_SIZE

    data = result._to_markdown(pretty=options.get("prettify_markdown", True),
                               show_formula_number=options.get("show_formula_number", False))
    images = None
    if options.get("return_markdown_images", True):
        images = postprocess_images(data["markdown_images"], "", filename_template="markdown/{key}",
                                    max_img_size=DEFAULT_MAX_OUTPUT_IMG_SIZE)
    starts, ends = data["page_continuation_flags"]
    found = {"text": data["markdown_texts"], "isStart": bool(starts), "isEnd": bool(ends), "images": images}
    return {"markdown": np.array([json.dumps(found, ensure_ascii=False).encode()], dtype=object)}


#: A classifier's classes, best first (single- and multi-label alike).
_CLASSES = (TensorSpec("class_ids", "INT32", (-1,)), TensorSpec("scores", "FP32", (-1,)),
            TensorSpec("label_names", "BYTES", (-1,)))
#: A detector's boxes, in PaddleX's order.
_BOXES = (*_CLASSES, TensorSpec("coordinates", "FP32", (-1, 4)))
#: A pipeline's result fields served as typed outputs beside ``result``: pipeline_name -> (their specs,
#: how PaddleX's result, its JSON and itself, and the request's ``RENDERING`` options give them). A pipeline
#: not listed answers ``result`` alone.
FIELDS: dict[str, tuple[tuple[TensorSpec, ...], Callable[[dict, Any, dict], dict[str, np.ndarray]]]] = {
    "OCR": ((TensorSpec("rec_texts", "BYTES", (-1,)), TensorSpec("rec_scores", "FP32", (-1,)),
             TensorSpec("rec_polys", "INT32", (-1, 4, 2)), TensorSpec("rec_boxes", "INT32", (-1, 4)),
             TensorSpec("dt_polys", "INT32", (-1, 4, 2)), TensorSpec("textline_orientation_angles", "INT32", (-1,)),
             TensorSpec("doc_preprocessor_angle", "INT32", (1,))), _ocr),
    "image_classification": (_CLASSES, _classes),
    "image_multilabel_classification": (_CLASSES, _classes),
    "object_detection": (_BOXES, _boxes),
    "small_object_detection": (_BOXES, _boxes),
    "instance_segmentation": (_BOXES, _boxes),  # each box's mask (cut to the box) is in ``result``
    "doc_preprocessor": ((TensorSpec("angle", "INT32", (1,)), TensorSpec("output_img", "UINT8", (1, -1, -1, 3))),
                         _page),
    "semantic_segmentation": ((TensorSpec("pred", "INT32", (1, -1, -1)),), _segments),
    "PP-StructureV3": ((TensorSpec("markdown", "BYTES", (1,)),), _markdown),
    "ts_forecast": ((TensorSpec("forecast", "BYTES", (1,)),), _forecast),
}
#: A request's settings of how a pipeline's answer is rendered, not of its ``predict``: PaddleX serving's apps
#: hand them to the result's own methods, as the step does (``FIELDS``' options): pipeline_name -> {setting:
#: kind}, each kind as ``protocol.paddlex.kind_of`` gives it. Their defaults are PaddleX serving's.
RENDERING: dict[str, dict[str, str]] = {
    "PP-StructureV3": {"prettify_markdown": "bool", "show_formula_number": "bool", "return_markdown_images": "bool"},
}
RESULT = TensorSpec("result", "BYTES", (1,))
IMAGE = TensorSpec("image", "BYTES", (1,))
CSV = TensorSpec("csv", "BYTES", (1,))
#: A pipeline's input where it is not an image (one encoded file a request, as PaddleX serving's app takes it):
#: pipeline_name -> its spec. A CSV is a time series, read as PaddleX serving reads it (``series``).
INPUTS = {"ts_forecast": CSV}


def input_of(kind: str) -> TensorSpec:
    return INPUTS.get(kind, IMAGE)


def outputs_of(kind: str) -> tuple[TensorSpec, ...]:
    return (RESULT, *FIELDS.get(kind, ((), None))[0])


class PaddleXPipeline(Model):
    """A PaddleX pipeline file's pipeline, on a CPU worker: PaddleX's own pipeline object, one request a
    ``predict``, each network call a job of its export's model on the devices."""

    inputs = (IMAGE,)
    outputs = (RESULT,)
    takes_arrays = True  # the page goes to PaddleX as the array it was decoded into

    def load(self, context):
        parameters = context.parameters
        self.kind, self.links = parameters["kind"], parameters["links"]
        self.pipeline = build(parameters["config"], self.links, self._call)
        return None

    def _call(self, link: Link, arrays: list[np.ndarray]) -> list[np.ndarray]:
        # The networks read no request parameters: called without them ({}), a call shares forward passes
        # with every request's calls of its shape, whatever their settings; and it goes to the least loaded
        # device (a CPU worker that is a device's too would run them all itself).
        answer = self.infer(link.model, dict(zip(link.inputs, arrays)), list(link.outputs), parameters={},
                            anywhere=True)
        return joined(link, [answer[name] for name in link.outputs])

    def preprocess(self, inputs):
        checks.settings(self.context.parameters["settings"], self.request_parameters)  # a bad one: this request's 400
        if input_of(self.context.parameters["kind"]) is CSV:  # (preprocess may run where load did not)
            # Its bytes as a row, to the step, which reads them once (``series``: what pandas cannot read is
            # this request's 400 there, as a series the model cannot take is).
            data = one_file(inputs, CSV.name, "a CSV file's bytes (UTF-8)")
            return {CSV.name: np.frombuffer(data, np.uint8)[None]}
        return {"image": decoded(inputs)[None]}

    def execute(self, inputs):
        spec = input_of(self.kind)
        given = inputs[spec.name]  # (a tensor in a subclass that takes none: read back)
        given = (given if isinstance(given, np.ndarray) else given.numpy())[0]
        page = series(given.tobytes()) if spec is CSV else given
        settings = checks.settings(self.context.parameters["settings"], self.request_parameters)
        options = {key: settings.pop(key) for key in RENDERING.get(self.kind, {}) if key in settings}
        try:
            with building(self.links, self._call):  # (PaddleX builds some modules at a request's first need)
                results = list(self.pipeline.predict(page, **settings))
        except (ValueError, KeyError) as exc:
            if spec is not CSV:
                raise
            # PaddleX's time-series processors fail so on a series its model cannot take (too short, without
            # the model's columns); PaddleX serving answers them 500, with the same words.
            raise InputError(f"PaddleX's {self.kind} pipeline cannot take this series ({type(exc).__name__}: "
                             f"{str(exc)[:160]}); send a CSV with the time and target columns and at least as many "
                             "rows as its model's inference.yml names (info_params, size.in_chunk_len)") from None
        except Exception as exc:
            # PaddleX's pipelines fail so on a module switched on that the file has no model for
            # (AttributeError: no textline_orientation_model; AssertionError: no config for it); PaddleX
            # serving answers them 500. Any other failure is the service's.
            switched = sorted(key for key, value in settings.items() if key.startswith("use_") and value is True)
            if not switched or isinstance(exc, ServiceError) or not isinstance(exc, (AttributeError, AssertionError)):
                raise
            raise InputError(f"PaddleX's {self.kind} pipeline failed with {', '.join(switched)} true "
                             f"({type(exc).__name__}: {str(exc)[:120]}): its file may have no model for it; send "
                             "false or leave it out") from None
        if len(results) != 1:
            raise RuntimeError(f"PaddleX's {self.kind} pipeline answered {len(results)} results for one image")
        if isinstance(results[0], dict) and results[0].keys() == {"error"}:
            # PaddleX's pipelines answer so for settings they cannot run with (a module the file has no model
            # for, turned on); PaddleX serving answers it 500, with the same words.
            raise InputError(f"PaddleX's {self.kind} pipeline refused the request's settings "
                             f"({', '.join(sorted(settings)) or 'none'}): {results[0]['error']}; send settings its file "
                             "has models for")
        res = results[0].json["res"]
        found = {"result": np.array([json.dumps(prune(res), ensure_ascii=False).encode()], dtype=object)}
        fields = FIELDS.get(self.kind)
        if fields is not None:
            found |= fields[1](res, results[0], options)
        return found


def prune(result: Any) -> Any:
    """PaddleX serving's ``prune_result``: a result without its ``input_path`` and ``page_index`` (the service's
    caller knows which file and page it sent)."""
    from paddlex.inference.serving.basic_serving._pipeline_apps._common.common import prune_result

    return prune_result(result)


#: The most pixels an image may claim to be decoded: 2^26, three bytes each as BGR, a 50-megapixel photo
#: with room to spare. A small PNG may decode to gigabytes, and a header may claim any size in a few
#: bytes (OpenCV raises, not refuses, past its own 2^30; docs/models.md).
MAX_DECODED_PIXELS = 1 << 26
#: The most one side of an image may be of the other: PaddleX's resizes bring the shorter side to a length
#: (a classifier's 256, say) with no bound on the longer, so a strip of a few bytes, 1 x 20000, would be
#: resized to 256 x 5 million. Within it, the largest such resize is 256 x 65536.
MAX_ASPECT = 256


def one_file(inputs, name: str, what: str) -> bytes:
    """A request's one file, its input ``name`` (BYTES); ``InputError`` naming ``what`` to send where it is not."""
    data = inputs[name].reshape(-1)
    if data.size != 1:
        raise InputError(f"input {name!r}: one file a request, got {data.size}")
    blob = data[0]
    if not isinstance(blob, (bytes, bytearray)) or not blob:
        raise InputError(f"input {name!r}: expected {what}")
    return bytes(blob)


def series(data: bytes):
    """A request's CSV as PaddleX serving's app reads it (its ``csv_bytes_to_data_frame``: UTF-8, pandas), the
    DataFrame PaddleX's time-series pipelines take; ``InputError`` naming what to send where it is not one."""
    import pandas as pd
    from paddlex.inference.serving.infra.utils import csv_bytes_to_data_frame

    try:
        frame = csv_bytes_to_data_frame(data)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"input 'csv': not a CSV pandas can read ({len(data)} bytes, starting {data[:8]!r}: "
                         f"{type(exc).__name__}); send a UTF-8 CSV file's bytes, a header row first") from None
    if frame.empty:
        raise InputError("input 'csv': the CSV has no rows; send the series, a row a time step")
    return frame


def decoded(inputs) -> np.ndarray:
    """A request's one encoded image (its input ``image``), decoded as PaddleX serving reads it: OpenCV, BGR.
    ``InputError`` naming what to send where it is not one image OpenCV can decode, or its header claims
    over ``MAX_DECODED_PIXELS``."""
    import cv2

    blob = one_file(inputs, "image", "the bytes of an encoded image (JPEG, PNG, BMP, TIFF, WebP)")
    size = checks.claimed_size(blob)
    if size is None or size[0] * size[1] > MAX_DECODED_PIXELS:
        from PIL import Image

        pixels = size[0] * size[1] if size else 2 * (Image.MAX_IMAGE_PIXELS or 0)  # (at least Pillow's limit)
        claims = f"{'' if size else 'over '}{pixels / 1e6:.0f} million"
        raise InputError(f"input 'image': its header claims {claims} pixels ({len(blob)} bytes); send an image of at "
                         f"most {MAX_DECODED_PIXELS >> 20} million pixels (a 12-megapixel photo is fine)")
    if size and min(size) and max(size) > MAX_ASPECT * min(size):
        raise InputError(f"input 'image': {size[0]}x{size[1]} px: PaddleX's resizes would make a side of it hundreds "
                         f"of times longer; send an image whose sides are within 1:{MAX_ASPECT}")
    image = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise InputError(f"input 'image': not an image OpenCV can decode ({len(blob)} bytes, starting "
                         f"{bytes(blob[:8])!r}); send a JPEG, PNG, BMP, TIFF or WebP file's bytes")
    return image
