"""PaddleX's pipeline files served with no code: ``<repository>/<name>/pipeline.yaml`` is the YAML that
``paddlex --serve --pipeline FILE`` takes, unchanged, and becomes pipeline ``<name>`` of the repository.

Each of its SubModules becomes a model of the repository, named ``<name>.<SubModule>`` (for OCR
``ocr.TextDetection``, ``ocr.TextRecognition``): its export (``model_dir``: absolute, or relative to the
file) runs on the devices, batched across requests. The pre- and post-processing (the export's
``inference.yml`` and the file's settings) are CPU steps of the pipeline, run with PaddleX's own
processors (``models/paddlex_ocr.py``) on CPU workers under ``PlaceEnv('cpu')``:

    image (BYTES) -> <name>.prepare (CPU: decode; with the document preprocessor the page's orientation
                     classified by <name>.DocOrientationClassify and the page turned upright, then
                     flattened by <name>.DocUnwarping; PaddleX's det resize and normalisation)
                  -> <name>.TextDetection (a device)
                  -> <name>.read (CPU: DB postprocess, box sort, crops; with text-line orientation
                     the crops classified by <name>.TextLineOrientation and the upside-down ones
                     turned; the crops' groups read by <name>.TextRecognition on the devices, all at
                     once; CTC decode)
                  -> rec_texts, rec_scores, rec_polys, rec_boxes, dt_polys, textline_orientation_angles,
                     doc_preprocessor_angle

Supported: PaddleX's ``OCR`` pipeline with text detection and recognition; text-line orientation, and the
document preprocessor (its ``SubPipelines.DocPreprocessor``: page orientation, unwarping), where the
file turns them on and gives their models. A file that turns one on without its model is refused,
naming the SubModule to give and the switch that turns it off. PaddleX's ``image_classification``
pipeline (``_classification``; its CPU steps in ``models/paddlex_classification.py``), and its
``object_detection`` pipeline (``_detection``; ``models/paddlex_detection.py``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from ..protocol.paddlex import TOPK_MAX
from .base import ModelContext
from .inference import InferenceOptions
from .configs import InstanceGroup, ModelConfig, RepositoryError, Step, TensorOverride
from .entries import Entry, Version
from .reading import config_fingerprint, load_entry

#: PaddleX's pipelines served here, and the modules each needs.
SUPPORTED = {"OCR": ("TextDetection", "TextRecognition"), "image_classification": ("ImageClassification",),
             "object_detection": ("ObjectDetection",)}
#: The OCR pipeline's optional modules served here: the file's switch (PaddleX's default when the file
#: leaves it out: on), and the SubModule it needs.
OPTIONAL = {"use_textline_orientation": "TextLineOrientation"}
#: The document preprocessor's modules (``SubPipelines.DocPreprocessor``, PaddleX's ``doc_preprocessor``
#: pipeline): the sub-pipeline's switch of each (PaddleX's default: on) and its SubModule.
DOC_PREPROCESSOR = {"use_doc_orientation_classify": "DocOrientationClassify", "use_doc_unwarping": "DocUnwarping"}
#: The classes a module's classifier must answer (PaddleX reads the document's angle from the label's name).
LABELS = {"TextLineOrientation": ("0_degree", "180_degree"), "DocOrientationClassify": ("0", "90", "180", "270")}

#: PaddleX's own defaults (paddlex 3.7's configs/pipelines/OCR.yaml), for a setting the file leaves out.
DETECTION_DEFAULTS = {"limit_side_len": 64, "limit_type": "min", "max_side_limit": 4000, "thresh": 0.3,
                      "box_thresh": 0.6, "unclip_ratio": 1.5}
RECOGNITION_DEFAULTS = {"batch_size": 6, "score_thresh": 0.0}
#: PaddleX's batch size of a module whose settings leave it out (its create_model's).
MODULE_BATCH_SIZE = 1

#: CPU workers of a pipeline's CPU steps: an image's decode, resizes and crops (numpy and OpenCV, which
#: release the GIL for much of it) on two threads. The environment variable
#: ``PLACEENV_PADDLEX_CPU_WORKERS`` (a whole number, 1 to 64), read when a pipeline file is read, sets
#: another count, for tuning and ``benchmarks/paddlex_serving.py --cpu-scaling``.
CPU_WORKERS = 2
CPU_WORKERS_VARIABLE = "PLACEENV_PADDLEX_CPU_WORKERS"


def cpu_workers() -> int:
    """The CPU steps' worker count: ``PLACEENV_PADDLEX_CPU_WORKERS`` where set, else ``CPU_WORKERS``."""
    given = os.environ.get(CPU_WORKERS_VARIABLE, "").strip()
    if not given:
        return CPU_WORKERS
    if not given.isdigit() or not 1 <= int(given) <= 64:
        raise ValueError(f"{CPU_WORKERS_VARIABLE}={given!r}: expected a whole number of CPU workers, 1 to 64")
    return int(given)


def read(name: str, path: Path, max_batch_size: int, max_batch_delay_ms: float
         ) -> tuple[dict[str, Entry], ModelConfig, dict[str, Any]]:
    """The models a PaddleX pipeline file makes, by name; the pipeline's config over them (its steps,
    inputs and outputs), which ``linking.link`` links as any pipeline's; and what PaddleX serving's
    API says of it (its ``pipeline_name`` and settings). ``RepositoryError`` names the file and what is
    wrong or missing."""

    def refuse(problem: str) -> RepositoryError:
        return RepositoryError(name, path, f"PaddleX pipeline: {problem}")

    raw = _load_yaml(name, path)
    kind = raw.get("pipeline_name")
    if kind not in SUPPORTED:
        raise refuse(f"pipeline_name {kind!r} is not served here; served: {', '.join(SUPPORTED)}")
    try:
        workers = cpu_workers()
    except ValueError as exc:
        raise refuse(str(exc)) from None
    reader = {"image_classification": _classification, "object_detection": _detection}.get(kind, _ocr)
    return reader(name, path, raw, refuse, workers, max_batch_size, max_batch_delay_ms)


def _ocr(name: str, path: Path, raw: dict[str, Any], refuse, workers: int, max_batch_size: int,
         max_batch_delay_ms: float) -> tuple[dict[str, Entry], ModelConfig, dict[str, Any]]:
    """``read`` for PaddleX's ``OCR`` pipeline."""
    kind, modules, doc = _modules(refuse, raw)
    # Text-line orientation is served exactly where the file turns it on (_modules refuses it on without
    # its SubModule), so the module's presence is the file's switch.
    textline = "TextLineOrientation" in modules
    dirs = {key: _model_dir(refuse, path, module, key) for key, module in modules.items()}
    det, rec = modules["TextDetection"], modules["TextRecognition"]
    detection = {key: det.get(key, value) for key, value in DETECTION_DEFAULTS.items()}
    recognition = {key: rec.get(key, value) for key, value in RECOGNITION_DEFAULTS.items()}
    names = {step: f"{name}.{step}" for step in ("prepare", "read", *modules)}
    fingerprint = config_fingerprint(path)
    batches = {"TextDetection": max_batch_size, "TextRecognition": recognition["batch_size"]}
    for key, module in modules.items():
        if key not in batches:
            batches[key] = _batch_size(refuse, key, module)
    from . import paddlex_ocr  # the CPU steps' classes (PaddleX's processors load with their replicas)

    shorts = {key: _classifier(refuse, key, dirs[key], LABELS[key]) for key in LABELS.keys() & modules.keys()}
    entries = {names[key]: _export(names[key], key, dirs[key], module, batches[key], max_batch_delay_ms, refuse)
               for key, module in modules.items()}
    # Each export's one input and its first output, by module (PaddleX's predictors feed and read them so).
    io = {key: (entries[names[key]].default.inputs[0].name, entries[names[key]].default.outputs[0].name)
          for key in modules}

    def export_dir(key: str) -> str | None:  # None where the file does not use the module
        return str(dirs[key]) if key in dirs else None

    settings = {"detection": detection, "recognition": recognition, "det_dir": export_dir("TextDetection"),
                "rec_dir": export_dir("TextRecognition"), "rec_model": names["TextRecognition"],
                "text_type": raw.get("text_type"), "textline_model": names.get("TextLineOrientation"),
                "textline_dir": export_dir("TextLineOrientation"),
                "textline_batch_size": batches.get("TextLineOrientation"), "doc": doc,
                "orientation_model": names.get("DocOrientationClassify"),
                "orientation_dir": export_dir("DocOrientationClassify"),
                "orientation_short": shorts.get("DocOrientationClassify"),
                "unwarping_model": names.get("DocUnwarping"), "io": io}
    for step, cls in (("prepare", paddlex_ocr.Prepare), ("read", paddlex_ocr.Read)):
        entries[names[step]] = _cpu_step(names[step], path.parent, cls, settings, fingerprint, workers)
    about = {"pipeline_name": kind, "text_type": raw.get("text_type", "general"), "detection": detection,
             "recognition": recognition, "use_textline_orientation": textline, "doc_preprocessor": doc}
    return entries, _pipeline_config(kind, path, modules, names, io["TextDetection"]), about


def _classification(name: str, path: Path, raw: dict[str, Any], refuse, workers: int, max_batch_size: int,
                    max_batch_delay_ms: float) -> tuple[dict[str, Entry], ModelConfig, dict[str, Any]]:
    """``read`` for PaddleX's ``image_classification`` pipeline:

        image (BYTES) -> <name>.prepare (CPU: decode; PaddleX's resize, crop, normalisation)
                      -> <name>.ImageClassification (a device, batched across requests)
                      -> <name>.top (CPU: PaddleX's Topk) -> class_ids, scores, label_names
    """
    from . import paddlex_classification as steps

    key = "ImageClassification"
    module = _module(refuse, raw, key)
    directory = _model_dir(refuse, path, module, key)
    short = _classifier(refuse, key, directory, None)
    topk = module.get("topk")
    if topk is not None and (type(topk) is not int or not 1 <= topk <= TOPK_MAX):
        raise refuse(f"SubModules.{key}: topk {topk!r}: give a whole number from 1 to {TOPK_MAX}, or leave it out "
                     "(the export's inference.yml's)")
    model = _export(f"{name}.{key}", key, directory, module, _batch_size(refuse, key, module), max_batch_delay_ms,
                    refuse)
    given, scores = model.default.inputs[0].name, model.default.outputs[0].name
    entries, config = _between_cpu_steps(
        name, path, raw, key, model, (steps.Prepare, "top", steps.Top, steps.OUTPUTS),
        {"dir": str(directory), "topk": topk, "short": short}, workers,
        ({"x": "x"}, {given: "x"}, {scores: "probabilities"}, {"probabilities": "probabilities"}))
    return entries, config, {"pipeline_name": raw["pipeline_name"], "topk": topk}


def _detection(name: str, path: Path, raw: dict[str, Any], refuse, workers: int, max_batch_size: int,
               max_batch_delay_ms: float) -> tuple[dict[str, Entry], ModelConfig, dict[str, Any]]:
    """``read`` for PaddleX's ``object_detection`` pipeline:

        image (BYTES) -> <name>.prepare (CPU: decode; PaddleX's steps from the export's Preprocess)
                      -> <name>.ObjectDetection (a device, batched across requests, its boxes a row an image)
                      -> <name>.boxes (CPU: PaddleX's DetPostProcess)
                      -> class_ids, scores, label_names, coordinates
    """
    from . import paddlex_detection as steps

    key = "ObjectDetection"
    module = _module(refuse, raw, key)
    directory = _model_dir(refuse, path, module, key)
    try:
        settings = steps.file_settings(module)
        detector = steps.inspected(directory, module, settings)
    except ValueError as exc:
        raise refuse(f"{_where(key)}: {exc}") from None
    model = _detector_export(refuse, key, directory, _load_export(
        f"{name}.{key}", key, directory, module, _batch_size(refuse, key, module), max_batch_delay_ms, refuse))
    version = model.default
    # PaddleX's runner feeds ToBatch's arrays to the export's inputs in the order of their sorted names.
    inputs = sorted(spec.name for spec in version.inputs)
    if len(inputs) != len(detector.keys):
        raise refuse(f"{_where(key)}: {directory} takes {len(inputs)} inputs ({', '.join(inputs)}); PaddleX feeds a "
                     f"{detector.model_name} {len(detector.keys)} ({', '.join(detector.keys)}): give the model_dir "
                     "of its PaddleX export, and its model_name")
    boxes, counts = (spec.name for spec in version.outputs)
    entries, config = _between_cpu_steps(
        name, path, raw, key, model, (steps.Prepare, "boxes", steps.Boxes, steps.OUTPUTS),
        {"dir": str(directory), "model_name": detector.model_name, "settings": settings}, workers,
        ({**{k: k for k in detector.keys}, "size": "size"}, dict(zip(inputs, detector.keys)),
         {boxes: "detections", counts: "counts"}, {"detections": "detections", "counts": "counts", "size": "size"}))
    return entries, config, {"pipeline_name": raw["pipeline_name"], "threshold": settings["threshold"]}


def _module(refuse, raw: dict[str, Any], key: str) -> dict[str, Any]:
    """A single-model pipeline's SubModule ``key``, refused where the file has none."""
    module = (raw.get("SubModules") or {}).get(key)
    if not isinstance(module, dict):
        raise refuse(f"SubModules has no {key}: give its module_name, model_name and model_dir (a PaddleX export "
                     "directory)")
    return module


def _between_cpu_steps(name: str, path: Path, raw: dict[str, Any], key: str, model: Entry, steps: tuple,
                       settings: dict[str, Any], workers: int, links: tuple[dict, ...]
                       ) -> tuple[dict[str, Entry], ModelConfig]:
    """A single-model pipeline's models and config: ``<name>.prepare`` (CPU) -> ``model`` (the devices, run
    without the request's parameters, so that its batches join any requests) -> the last CPU step.
    ``steps``: the prepare step's class, the last step's name and class, the pipeline's outputs; ``links``:
    the prepare step's outputs, the model's inputs, its outputs and the last step's inputs (each a model's
    name -> the pipeline's tensor)."""
    prepare, last_name, last, outputs = steps
    names = {"prepare": f"{name}.prepare", key: model.name, last_name: f"{name}.{last_name}"}
    entries, fingerprint = {model.name: model}, config_fingerprint(path)
    for step, cls in (("prepare", prepare), (last_name, last)):
        entries[names[step]] = _cpu_step(names[step], path.parent, cls, settings, fingerprint, workers)
    config = ModelConfig(
        description=f"PaddleX's {raw['pipeline_name']} pipeline ({path.name}): "
                    f"{raw['SubModules'][key].get('model_name')}",
        inputs=[TensorOverride(name="image", datatype="BYTES", shape=[1])],
        outputs=[TensorOverride(name=s.name, datatype=s.datatype, shape=list(s.shape)) for s in outputs],
        pipeline=[
            Step(model=names["prepare"], inputs={"image": "image"}, outputs=links[0]),
            Step(model=model.name, inputs=links[1], outputs=links[2], parameters=False),
            Step(model=names[last_name], inputs=links[3], outputs={s.name: s.name for s in outputs}),
        ])
    return entries, config


def _modules(refuse, raw: dict[str, Any]) -> tuple[str, dict[str, dict], dict[str, bool] | None]:
    """An OCR file's kind; its SubModules served, by key (text detection and recognition, text-line
    orientation and the document preprocessor's where the file turns them on); and the document
    preprocessor's switches (None where the file turns it off). Refused where a switch is not True or
    False, or a SubModule or sub-pipeline needed is missing."""
    kind = raw["pipeline_name"]
    given = raw.get("SubModules") or {}
    wanted = [*SUPPORTED[kind], *(key for switch, key in OPTIONAL.items() if _switch(refuse, raw, switch))]
    missing = [m for m in wanted if not isinstance(given.get(m), dict)]
    if missing:
        turned = [switch for switch, key in OPTIONAL.items() if key in missing]
        off = f"; or set {' and '.join(f'{s}: False' for s in turned)}" if turned else ""
        raise refuse(f"SubModules has no {', '.join(missing)}: give each its module_name, model_name and "
                     f"model_dir (a PaddleX export directory){off}")
    modules = {key: given[key] for key in wanted}
    if not _switch(refuse, raw, "use_doc_preprocessor"):
        return kind, modules, None
    # As PaddleX's: a file that leaves use_doc_preprocessor out asks for it.
    sub = (raw.get("SubPipelines") or {}).get("DocPreprocessor")
    if not isinstance(sub, dict) or sub.get("pipeline_name") != "doc_preprocessor":
        raise refuse("use_doc_preprocessor is on (a file that leaves it out asks for it, as PaddleX's) but "
                     "SubPipelines has no DocPreprocessor with pipeline_name doc_preprocessor: give it (its "
                     "SubModules DocOrientationClassify and DocUnwarping, as PaddleX's OCR.yaml has them), or "
                     "set use_doc_preprocessor: False")
    doc = {switch: _switch(refuse, sub, switch, "SubPipelines.DocPreprocessor.") for switch in DOC_PREPROCESSOR}
    inner = sub.get("SubModules") or {}
    for switch, key in DOC_PREPROCESSOR.items():
        if doc[switch] and not isinstance(inner.get(key), dict):
            raise refuse(f"SubPipelines.DocPreprocessor.SubModules has no {key}: give its module_name, model_name "
                         f"and model_dir (a PaddleX export directory); or set {switch}: False in "
                         "SubPipelines.DocPreprocessor")
        if doc[switch]:
            modules[key] = inner[key]
    return kind, modules, doc


def _switch(refuse, raw: dict[str, Any], switch: str, where: str = "") -> bool:
    """A module's switch in the file: True or False, PaddleX's default (True) where it is left out."""
    value = raw.get(switch, True)
    if not isinstance(value, bool):
        raise refuse(f"{where}{switch} {value!r}: give True or False")
    return value


def _classifier(refuse, key: str, directory: Path, labels: tuple[str, ...] | None) -> int | None:
    """A classifier export's ``ResizeImage resize_short`` (None: a fixed size). Refused where its
    ``inference.yml`` is not one PaddleX's classification predictor runs (no ``ResizeImage`` size, no
    ``Topk`` with its ``topk``), or its classes are not the module's ``labels`` (any: None)."""
    from .paddlex_ocr import _transform_ops

    ops, post = _transform_ops(str(directory))
    topk = post.get("Topk")
    resize = ops.get("ResizeImage") or {}
    if (not (resize.get("size") or resize.get("resize_short")) or not isinstance(topk, dict)
            or topk.get("topk") is None):
        raise refuse(f"{_where(key)}: {directory / 'inference.yml'} is not a classifier's inference.yml "
                     "(PreProcess ResizeImage, PostProcess Topk with topk): give the model_dir of its PaddleX export")
    given = topk.get("label_list")
    # The text-line classes are read by number, the page's angle from the class's name: that needs the names.
    named = key in DOC_PREPROCESSOR.values()
    if labels is not None and (given is None and named or given is not None and (
            len(given) != len(labels) or named and sorted(map(str, given)) != sorted(labels))):
        has = "no label_list" if given is None else f"{len(given)} ({', '.join(map(str, given))})"
        raise refuse(f"{_where(key)}: a {key} model answers {len(labels)} classes ({', '.join(labels)}); "
                     f"{directory} has {has}")
    return resize.get("resize_short")


def _where(key: str) -> str:
    """Where the file gives a SubModule."""
    return f"{'SubPipelines.DocPreprocessor.' if key in DOC_PREPROCESSOR.values() else ''}SubModules.{key}"


def _batch_size(refuse, key: str, module: dict) -> int:
    size = module.get("batch_size", MODULE_BATCH_SIZE)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 1024:
        raise refuse(f"{_where(key)}: batch_size {size!r}: give a whole number from 1 to 1024")
    return size


def _pipeline_config(kind: str, path: Path, modules: dict[str, dict], names: dict[str, str],
                     detector: tuple[str, str]) -> ModelConfig:
    """The pipeline's config over its models (``names``, by step; the ``detector``'s input and output
    names): its steps, inputs and outputs (the read step's, and the prepare step's page angle)."""
    from .paddlex_ocr import Prepare, Read

    angle = next(s for s in Prepare.outputs if s.name == "doc_preprocessor_angle")
    return ModelConfig(
        description=f"PaddleX's {kind} pipeline ({path.name}): "
                    + ", ".join(str(m.get("model_name")) for m in modules.values()),
        inputs=[TensorOverride(name="image", datatype="BYTES", shape=[1])],
        outputs=[TensorOverride(name=s.name, datatype=s.datatype, shape=list(s.shape))
                 for s in (*Read.outputs, angle)],
        pipeline=[
            Step(model=names["prepare"], inputs={"image": "image"},
                 outputs={"x": "x", "page": "page", "shape": "shape",
                          "doc_preprocessor_angle": "doc_preprocessor_angle"}),
            Step(model=names["TextDetection"], inputs={detector[0]: "x"}, outputs={detector[1]: "maps"},
                 parameters=False),
            Step(model=names["read"], inputs={"maps": "maps", "page": "page", "shape": "shape"},
                 outputs={s.name: s.name for s in Read.outputs}),
        ])


def _load_yaml(name: str, path: Path) -> dict[str, Any]:
    import yaml  # pyyaml, the service's

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - any parse failure is the file's
        raise RepositoryError(name, path, f"not readable: {type(exc).__name__}: {exc}") from None
    if not isinstance(raw, dict):
        raise RepositoryError(name, path, f"expected PaddleX's pipeline settings (a mapping), got "
                              f"{type(raw).__name__}")
    return raw


def _model_dir(refuse, path: Path, module: dict, key: str) -> Path:
    """A SubModule's export directory: ``model_dir`` absolute, or relative to the pipeline file (PaddleX
    would read it against its working directory, which a service's is not)."""
    given = module.get("model_dir")
    if not given:
        raise refuse(f"{_where(key)}: no model_dir: give the directory of its PaddleX export "
                     "(inference.json, inference.pdiparams, inference.yml); the service downloads nothing")
    directory = Path(given) if Path(given).is_absolute() else (path.parent / given)
    if not (directory / "inference.json").is_file() or not (directory / "inference.yml").is_file():
        raise refuse(f"{_where(key)}: model_dir {given!r} ({directory}) holds no PaddleX export: expected "
                     "inference.json, inference.pdiparams and inference.yml there")
    return directory.resolve()


def _load_export(name: str, key: str, directory: Path, module: dict, batch: int, delay_ms: float,
                 refuse) -> Entry:
    """SubModule ``key``'s export as model ``name``: a Predictor (oneDNN as the module's
    ``engine_config.run_mode`` says: ``paddle`` off, ``mkldnn`` on; else on, and off where it cannot run the
    program)."""
    engine = module.get("engine_config") or {}
    run_mode = engine.get("run_mode")
    # Unset, the service's default (every core), not PaddleX's 10: here a Predictor's runs leave the GIL and
    # overlap, and more threads than cores then take turns on them (docs/benchmarks.md, "Predictor runs").
    cpu_threads = engine.get("cpu_threads")
    if cpu_threads is not None and (not isinstance(cpu_threads, int) or not 1 <= cpu_threads <= 1024):
        raise refuse(f"{_where(key)}: engine_config cpu_threads {cpu_threads!r}: give a whole number from 1 "
                     "to 1024, or leave it out (every core)")
    if run_mode not in (None, "paddle", "mkldnn"):
        raise refuse(f"{_where(key)}: engine_config run_mode {run_mode!r} is not served here; use paddle "
                     "or mkldnn (on a CPU), or leave it out")
    config = ModelConfig(
        description=f"PaddleX {module.get('module_name')}: {module.get('model_name')} ({directory})",
        max_batch_size=batch, max_batch_delay_ms=delay_ms,
        # No batch_padding for the recogniser: a group padded wider to join another page's changes its scores
        # (by up to 0.015 on the test pages), and PaddleX's own groups of batch_size fill a batch already.
        inference=InferenceOptions(onednn=run_mode != "paddle", cpu_threads=cpu_threads))
    return load_entry(name, directory, config, None, batch, delay_ms)


def _export(name: str, key: str, directory: Path, module: dict, batch: int, delay_ms: float, refuse) -> Entry:
    """``_load_export``, refused unless the export takes one tensor (the image, as PaddleX's predictors feed
    it), and for the unwarping model unless it answers an image."""
    entry = _load_export(name, key, directory, module, batch, delay_ms, refuse)
    version = entry.default
    if len(version.inputs) != 1 or not version.outputs:
        raise refuse(f"{_where(key)}: {directory} takes {len(version.inputs)} inputs "
                     f"({', '.join(s.name for s in version.inputs)}) and answers {len(version.outputs)}; a "
                     f"{module.get('module_name')} export takes one, the image: give the model_dir of its PaddleX "
                     "export")
    shape = version.outputs[0].shape
    if key == "DocUnwarping" and (len(shape) != 4 or shape[1] not in (3, -1)):
        raise refuse(f"{_where(key)}: {directory} answers {list(shape)}; an unwarping model answers the page, "
                     "[N, 3, H, W]: give the model_dir of UVDoc's PaddleX export")
    return entry


def _detector_export(refuse, key: str, directory: Path, entry: Entry) -> Entry:
    """A detector's export (``_load_export``), refused unless it takes and answers what PaddleDetection's
    exports do; its answers then a row an image (``paddlex_detection.per_image``)."""
    from .paddlex_detection import per_image

    version = entry.default
    shape = version.outputs[0].shape if version.outputs else ()
    counts = version.outputs[1].shape if len(version.outputs) > 1 else ()
    if (len(version.inputs) not in (2, 3) or len(version.outputs) != 2 or len(shape) != 2
            or shape[1] not in (6, 7, 8, -1) or len(counts) != 1):
        given = ", ".join(f"{s.name} {list(s.shape)}" for s in (*version.inputs, *version.outputs))
        raise refuse(f"{_where(key)}: {directory} takes {len(version.inputs)} inputs and answers "
                     f"{len(version.outputs)} ({given}); a PaddleDetection export takes the image and its scale "
                     "factor (and for some its size) and answers its boxes [M, 6] and their count an image [N] "
                     "(instance segmentation's masks are not served): give the model_dir of its PaddleX export")
    boxes = version.outputs[0]
    version.model_class = per_image(version.model_class, boxes.name, version.outputs[1].name)
    version.context = dataclasses.replace(version.context, outputs=(
        dataclasses.replace(boxes, shape=(-1, -1, shape[1])), *version.outputs[1:]))
    return entry


def _cpu_step(name: str, directory: Path, cls, settings: dict, fingerprint: str, workers: int) -> Entry:
    config = ModelConfig(description=cls.__doc__.strip().splitlines()[0], max_batch_size=0, warmup=[],
                         instance_group=[InstanceGroup(kind="cpu", count=workers)])
    context = ModelContext(name, 1, directory, None, cls.inputs, cls.outputs, settings)
    return Entry(name, directory, config, None, {1: Version(cls, context, fingerprint)}, 0, 0.0)
