"""PaddleX's pipeline files served with no code: ``<repository>/<name>/pipeline.yaml`` is the YAML that
``paddlex --serve --pipeline FILE`` takes, unchanged, and becomes pipeline ``<name>`` of the repository.

One mechanism serves every pipeline whose networks run through PaddleX's runner (``paddlex_pipeline``):

    image (BYTES) -> <name>.pipeline (CPU workers: PaddleX's own pipeline object built from the file, one
                     a worker; its ``predict`` on the image, under PlaceEnv('cpu'); ts_forecast's input is a
                     CSV, ``csv``)
                        each network call -> <name>.<SubModule> (the module's export, on the devices,
                                             batched across requests' calls of one shape)
                  -> result (PaddleX's result as JSON), and for the pipelines of FIELDS its fields typed

Reading the file builds PaddleX's pipeline object once, with runners that only record which modules it
builds, so the models served are exactly the ones PaddleX makes of the file (its switches, sub-pipelines
and defaults decide; with those it builds only at a request's first need, ``_later``), and what PaddleX
refuses of the file is refused at start, naming it. Each module's
export (``model_dir``: absolute, or relative to the file) is a model of the repository, named
``<name>.<SubModule>`` (with its sub-pipeline's key where two modules share a key); a ``model_dir`` used
twice is one model.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any

from ..protocol.paddlex import NOT_SETTINGS, kind_of, setting_name
from .configs import InstanceGroup, ModelConfig, RepositoryError, Step, TensorOverride
from .entries import Entry, Version
from .inference import ChoiceOptions, InferenceOptions
from .runtimes import RuntimeOptions
from .base import ModelContext
from .paddlex_pipeline import MODEL_KEY
from .reading import config_fingerprint, load_entry

#: PaddleX's batch size of a module whose settings leave it out (its create_model's).
MODULE_BATCH_SIZE = 1
#: The keys of PaddleX's settings that choose how PaddleX runs a network: read here for the export's
#: Predictor (``engine_config``'s run_mode and cpu_threads), never handed to PaddleX, whose networks the
#: service runs.
ENGINE_KEYS = ("engine", "engine_config", "use_hpip", "hpi_config", "device")
#: Of those, the ones that name a runtime: obeyed where they do (``backend_of``), else the service measures.
RUNTIME_KEYS = ("engine", "use_hpip", "hpi_config")
#: PaddleX's engines (``engine``) and high-performance inference backends (``hpi_config.backend``) that name a
#: runtime the service has, and its backend for each.
ENGINES = {"paddle": "inference", "paddle_static": "inference", "paddle_dynamic": "jit",
           "onnxruntime": "onnxruntime", "openvino": "openvino"}

#: CPU workers of a PaddleX pipeline, each with a pipeline object of its own: a request holds one while its
#: networks run on the devices, so there are more than cores. ``PLACEENV_PADDLEX_CPU_WORKERS`` (a whole
#: number, 1 to 64), read when a pipeline file is read, sets another count. Where the service serves the
#: CPU itself, the CPU device's workers run them (``--workers-per-device``), as any CPU step.
CPU_WORKERS = 8
CPU_WORKERS_VARIABLE = "PLACEENV_PADDLEX_CPU_WORKERS"
#: PaddleX's pipelines whose input the service does not read (an image a request, or the CSV of
#: ``paddlex_pipeline.INPUTS``' pipelines), and what it is.
NOT_IMAGES = {"ts_anomaly_detection": "a time series (CSV) whose result the service does not answer yet",
              "ts_classification": "a time series (CSV) whose result the service does not answer yet",
              "video_classification": "a video",
              "video_detection": "a video", "3d_bev_detection": "point clouds and camera images (a tar file)",
              "multilingual_speech_recognition": "audio", "text_to_speech": "text"}
#: A module's model_dir that holds no export, as handed to PaddleX's probe: PaddleX says it does not exist.
_MISSING = "placeenv-no-export-at-"


def cpu_workers() -> int:
    """The pipelines' CPU worker count: ``PLACEENV_PADDLEX_CPU_WORKERS`` where set, else ``CPU_WORKERS``."""
    given = os.environ.get(CPU_WORKERS_VARIABLE, "").strip()
    if not given:
        return CPU_WORKERS
    if not given.isdigit() or not 1 <= int(given) <= 64:
        raise ValueError(f"{CPU_WORKERS_VARIABLE}={given!r}: expected a whole number of CPU workers, 1 to 64")
    return int(given)


@dataclasses.dataclass
class Module:
    """A SubModule of the file: where it is (``SubModules.TextDetection``,
    ``SubPipelines.DocPreprocessor.SubModules.DocUnwarping``), its settings, its export's directory (None where
    the file gives none or it holds no export) and the engine settings PaddleX would run it with."""

    where: str
    settings: dict[str, Any]
    directory: Path | None
    engine_config: dict[str, Any]

    @property
    def key(self) -> str:
        return self.where.rsplit(".", 1)[-1]

    @property
    def path(self) -> str:
        """Its key, with its sub-pipelines' keys before it."""
        return ".".join(p for p in self.where.split(".") if p not in ("SubModules", "SubPipelines"))


def read(name: str, path: Path, max_batch_size: int, max_batch_delay_ms: float
         ) -> tuple[dict[str, Entry], ModelConfig, dict[str, Any]]:
    """The models a PaddleX pipeline file makes, by name; the pipeline's config over them, which
    ``linking.link`` links as any pipeline's; and what PaddleX serving's API says of it (its
    ``pipeline_name`` and settings). ``RepositoryError`` names the file and what is wrong or missing."""
    from . import paddlex_pipeline as seam

    def refuse(problem: str) -> RepositoryError:
        return RepositoryError(name, path, f"PaddleX pipeline: {problem}")

    raw = _load_yaml(name, path)
    kind = raw.get("pipeline_name")
    if not isinstance(kind, str) or not kind:
        raise refuse("no pipeline_name: give PaddleX's pipeline file (its pipeline_name, SubModules, ...)")
    if kind in NOT_IMAGES:
        raise refuse(f"pipeline_name {kind}: its input is {NOT_IMAGES[kind]}; the service serves PaddleX's pipelines "
                     "that read an image, and ts_forecast (docs/models.md lists them)")
    try:
        workers = cpu_workers()
    except ValueError as exc:
        raise refuse(str(exc)) from None
    config, modules = _prepared(raw, path)
    for where, module in modules.items():
        _batch_size(refuse, where, module.settings)
    refused = seam.register({str(m.settings["model_name"]) for m in modules.values() if m.settings.get("model_name")})
    built: list = []
    probe = {where: seam.Link(where, (), ()) for where in modules}
    try:
        pipeline = seam.build(config, probe, None, built)
    except Exception as exc:  # noqa: BLE001 - what PaddleX refuses of the file
        raise refuse(_why(exc, modules, refused, kind)) from None
    try:
        used = {where: modules[where] for where in dict.fromkeys(where for where, _, _ in built)}
        used |= _later(modules, used, pipeline)
        entries, links = _exports(name, used, built, refuse)
        table = _settings(kind, pipeline)
    finally:
        _close(pipeline)
    step = f"{name}.pipeline"
    outputs = seam.outputs_of(kind)
    settings = {"kind": kind, "config": config, "links": links, "settings": table}
    cpu = ModelConfig(description=f"PaddleX's {kind} pipeline object ({path.name}), one a CPU worker",
                      max_batch_size=0, warmup=[], instance_group=[InstanceGroup(kind="cpu", count=workers)])
    given = seam.input_of(kind)
    context = ModelContext(step, 1, path.parent, None, (given,), outputs, settings)
    entries[step] = Entry(step, path.parent, cpu, None,
                          {1: Version(seam.PaddleXPipeline, context, config_fingerprint(path))}, 0, 0.0)
    pipeline_config = ModelConfig(
        description=f"PaddleX's {kind} pipeline ({path.name}): "
                    + ", ".join(sorted({str(m.settings.get('model_name')) for m in used.values()})),
        inputs=[TensorOverride(name=given.name, datatype=given.datatype, shape=list(given.shape))],
        outputs=[TensorOverride(name=s.name, datatype=s.datatype, shape=list(s.shape)) for s in outputs],
        pipeline=[Step(model=step, inputs={given.name: given.name}, outputs={s.name: s.name for s in outputs})])
    return entries, pipeline_config, {"pipeline_name": kind, "settings": table}


def _prepared(raw: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, Module]]:
    """The file's settings as PaddleX is handed them, and its SubModules by where they are: each module's
    ``model_dir`` made absolute (a relative one is the file's directory's, not the working directory's), its
    ``engine_config`` naming it for the runner, PaddleX's own engine settings left out (``ENGINE_KEYS``)."""
    modules: dict[str, Module] = {}

    def walk(node: dict[str, Any], where: str, inherited: dict[str, Any]) -> dict[str, Any]:
        engine = {**inherited, **(node.get("engine_config") or {})} if isinstance(node.get("engine_config"),
                                                                             (dict, type(None))) else inherited
        engine = {**engine, **_runtime_keys(node)}
        out = {k: v for k, v in node.items() if k not in ENGINE_KEYS}
        for group in ("SubModules", "SubPipelines"):
            children = node.get(group)
            if not isinstance(children, dict):
                continue
            out[group] = {}
            for key, child in children.items():
                at = f"{where}{group}.{key}"
                if not isinstance(child, dict):
                    out[group][key] = child
                elif group == "SubPipelines":
                    out[group][key] = walk(child, at + ".", engine)
                else:
                    module = _module(at, child, path, engine)
                    modules[at] = module
                    given = {k: v for k, v in child.items() if k not in ENGINE_KEYS}
                    # A module without an export is handed to PaddleX as a directory that is not there, so
                    # that one PaddleX builds is refused, naming it, and PaddleX never downloads one.
                    given["model_dir"] = str(module.directory or path.parent / f"{_MISSING}{at}")
                    given["engine_config"] = {MODEL_KEY: at}
                    out[group][key] = given
        return out

    return walk(raw, "", {}), modules


def _module(where: str, settings: dict[str, Any], path: Path, engine: dict[str, Any]) -> Module:
    given = settings.get("model_dir")
    directory = None
    if isinstance(given, str) and given:
        found = Path(given) if Path(given).is_absolute() else path.parent / given
        if (found / "inference.json").is_file() and (found / "inference.yml").is_file():
            directory = found.resolve()
    own = settings.get("engine_config")
    return Module(where, settings, directory,
                  {**engine, **(own if isinstance(own, dict) else {}), **_runtime_keys(settings)})


def _runtime_keys(node: dict[str, Any]) -> dict[str, Any]:
    """PaddleX's settings that choose a module's runtime (``engine``, ``use_hpip``, ``hpi_config``), kept with
    its engine_config under their own names; a module's own override its pipeline's."""
    return {key: node[key] for key in RUNTIME_KEYS if key in node}


def _why(exc: Exception, modules: dict[str, Module], refused: dict[str, str], kind: str) -> str:
    """What PaddleX's failure to build the pipeline says of the file."""
    text = str(exc)
    if _MISSING in text:
        where = text.split(_MISSING, 1)[1].split()[0].split("/")[0].rstrip("!'\":,")
        module = modules.get(where)
        given = module.settings.get("model_dir") if module else None
        if not given:
            return (f"{where}: no model_dir: give the directory of its PaddleX export (inference.json, "
                    "inference.pdiparams, inference.yml); the service downloads nothing")
        return (f"{where}: model_dir {given!r} holds no PaddleX export: expected inference.json, "
                "inference.pdiparams and inference.yml there")
    if refused:  # (PaddleX may fail on such a model before it builds it)
        model_name, reason = next(iter(refused.items()))
        where = next((m.where for m in modules.values() if m.settings.get("model_name") == model_name), "")
        return f"{where}: {model_name} is not served here: {reason}"
    if type(exc).__name__ == "ClassNotFoundException":
        return f"PaddleX has no {kind!r} pipeline: give the pipeline_name of one of PaddleX's pipeline files"
    return f"PaddleX could not build its {kind} pipeline from the file: {type(exc).__name__}: {text[:400]}"


def _exports(name: str, used: dict[str, Module], built: list, refuse) -> tuple[dict[str, Entry], dict]:
    """The models of the modules PaddleX built (one a distinct export and its settings), and each module's
    link (what its runner calls)."""
    from paddlex.inference.models.bindings import try_get_binding
    from paddlex.inference.models.object_detection.predictor import DetRunnerPredictor

    from . import paddlex_pipeline as seam

    names = {where: _model_name(name, module, used) for where, module in used.items()}
    same: dict[tuple, str] = {}
    entries: dict[str, Entry] = {}
    links: dict[str, seam.Link] = {}
    model_names = {where: str(module.settings.get("model_name")) for where, module in used.items()}
    model_names |= {where: model_name for where, model_name, _ in built}
    for where, module in used.items():
        identity = (str(module.directory), repr(sorted(module.engine_config.items())))
        model = same.setdefault(identity, names[where])
        batch = _batch_size(refuse, where, module.settings)
        if model in entries:  # the same export again: one model, its largest batch
            entries[model].max_batch_size = max(entries[model].max_batch_size, batch)
            links[where] = next(link for link in links.values() if link.model == model)
            continue
        entry = _load_export(model, where, module, batch, refuse)
        version = entry.default
        predictor = try_get_binding(model_names[where], seam.ENGINE).predictor
        counts = issubclass(predictor, DetRunnerPredictor)
        if counts:
            _per_image(refuse, where, module, entry)
        entries[model] = entry
        links[where] = seam.Link(model, tuple(sorted(spec.name for spec in version.inputs)),
                                 tuple(spec.name for spec in version.outputs), counts)
    return entries, links


def _later(modules: dict[str, Module], built: dict[str, Module], pipeline) -> dict[str, Module]:
    """The modules PaddleX builds only when a request first asks for them (PP-StructureV3's table pipeline
    builds its TableOrientationClassify and its own OCR so): those whose settings the built pipeline object
    holds (each as handed to PaddleX, its ``engine_config`` naming it), with an export. A module of a part of
    the file PaddleX left off (a switch off) is held by nothing, and is not served."""
    held: set[str] = set()
    seen: set[int] = set()

    def walk(value, depth: int) -> None:
        if id(value) in seen or depth > 12:
            return
        seen.add(id(value))
        if isinstance(value, dict):
            engine = value.get("engine_config")
            if isinstance(engine, dict) and isinstance(engine.get(MODEL_KEY), str):
                held.add(engine[MODEL_KEY])
            for item in value.values():
                walk(item, depth + 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth + 1)
        elif type(value).__module__.startswith("paddlex.inference.pipelines") and hasattr(value, "__dict__"):
            for item in vars(value).values():
                walk(item, depth + 1)

    walk(pipeline, 0)
    return {where: modules[where] for where in sorted(held)
            if where in modules and where not in built and modules[where].directory is not None}


def _model_name(name: str, module: Module, used: dict[str, Module]) -> str:
    """``<name>.<key>``; ``<name>.<sub-pipeline>.<key>`` where another module the pipeline uses has its key."""
    shared = sum(1 for m in used.values() if m.key == module.key and m.directory != module.directory) > 0
    return f"{name}.{module.path if shared else module.key}"


def _batch_size(refuse, where: str, module: dict) -> int:
    size = module.get("batch_size", MODULE_BATCH_SIZE)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 1024:
        raise refuse(f"{where}: batch_size {size!r}: give a whole number from 1 to 1024")
    return size


def _load_export(name: str, where: str, module: Module, batch: int, refuse) -> Entry:
    """A module's export as model ``name``, on the backend its settings name (``backend_of``), else measured
    (``backend: auto``, models/choice.py). A Predictor's oneDNN is as the module's ``engine_config.run_mode``
    says: ``paddle`` off, ``mkldnn`` on; else on, and off where it cannot run the program. ``run_mode`` sets how
    Paddle Inference runs where it serves, the reference ``auto`` compares the others with: it names no runtime
    (PaddleX's ``engine`` does). Its batches go as soon as a worker is free (no delay): a request's calls come
    one after another, so a wait only adds to each."""
    engine = module.engine_config
    run_mode = engine.get("run_mode")
    # Unset, the service's default (every core), not PaddleX's 10: here a Predictor's runs leave the GIL and
    # overlap, and more threads than cores then take turns on them (docs/benchmarks.md, "Predictor runs").
    cpu_threads = engine.get("cpu_threads")
    if cpu_threads is not None and (not isinstance(cpu_threads, int) or not 1 <= cpu_threads <= 1024):
        raise refuse(f"{where}: engine_config cpu_threads {cpu_threads!r}: give a whole number from 1 "
                     "to 1024, or leave it out (every core)")
    if run_mode not in (None, "paddle", "mkldnn"):
        raise refuse(f"{where}: engine_config run_mode {run_mode!r} is not served here; use paddle "
                     "or mkldnn (on a CPU), or leave it out")
    kind = module.settings.get("module_name")
    config = ModelConfig(
        description=f"PaddleX {kind}: {module.settings.get('model_name')} ({module.directory})"
                    + (f"; {PIXEL_EXACT[kind]}" if kind in PIXEL_EXACT else ""),
        max_batch_size=batch, max_batch_delay_ms=0.0, backend=backend_of(engine, where, refuse),
        inference=InferenceOptions(onednn=run_mode != "paddle", cpu_threads=cpu_threads),
        runtime=RuntimeOptions(cpu_threads=cpu_threads),
        choice=ChoiceOptions(backends=["inference"]) if kind in PIXEL_EXACT else ChoiceOptions())
    return load_entry(name, module.directory, config, None, batch, 0.0)


#: PaddleX's modules whose answer is pixels cut at a threshold: an unwarped page rounded to 8-bit pixels that
#: the detector and recogniser then read, an instance's mask. ``auto`` measures Paddle Inference alone for them
#: (as PaddleX runs them), since any runtime's last-bit differences flip the pixels at the cut (the unwarping
#: stand-in on ONNX Runtime, 6e-5 from Paddle's, changed a line's score by 0.04 on the document-preprocessor
#: answer tests; the mask stand-in's masks lost their equality on the detection tests). A file's ``engine``
#: still names a runtime for one.
PIXEL_EXACT = {"image_unwarping": "its unwarped page is rounded to pixels the next networks read: backend auto "
                                  "measures Paddle Inference alone (a file's engine names another)",
               "instance_segmentation": "its masks are thresholded a pixel at a time, and a runtime's last-bit "
                                        "differences flip the pixels at the threshold: backend auto measures "
                                        "Paddle Inference alone (a file's engine names another)"}


def backend_of(engine: dict[str, Any], where: str, refuse) -> str:
    """The backend a module's PaddleX settings name: its ``engine`` (``paddle``, ``paddle_static``,
    ``paddle_dynamic``, ``onnxruntime``, ``openvino``), or with ``use_hpip`` (or ``engine: hpi``) its
    ``hpi_config.backend``; ``auto`` where they name none (HPI without a backend chooses by its table: the
    service measures instead)."""
    named = engine.get("engine")
    hpi = engine.get("hpi_config") if isinstance(engine.get("hpi_config"), dict) else {}
    if named == "hpi" or (named is None and engine.get("use_hpip") is True):
        named = hpi.get("backend")
        if named is None:
            return "auto"
        if named not in ENGINES:
            raise refuse(f"{where}: hpi_config backend {named!r} is not served here; use one of "
                         f"{', '.join(sorted(ENGINES))}, or leave it out (the service measures)")
    if named is None:
        return "auto"
    if named not in ENGINES:
        raise refuse(f"{where}: engine {named!r} is not served here; use one of {', '.join(sorted(ENGINES))}, "
                     "or leave it out (the service measures which runs the export fastest)")
    return ENGINES[named]


def _per_image(refuse, where: str, module: Module, entry: Entry) -> None:
    """A PaddleDetection export's model, its answers a row an image (``paddlex_pipeline.per_image``);
    refused unless it answers what those exports do: its boxes ``[M, K]`` and their count an image ``[N]``
    (then any outputs of a row a box)."""
    from .paddlex_pipeline import per_image

    version = entry.default
    outputs = version.outputs
    if len(outputs) < 2 or len(outputs[0].shape) != 2 or len(outputs[1].shape) != 1:
        given = ", ".join(f"{s.name} {list(s.shape)}" for s in (*version.inputs, *outputs))
        raise refuse(f"{where}: {module.directory} answers {given}; a PaddleDetection export answers its boxes "
                     "[M, 6] and their count an image [N]: give the model_dir of its PaddleX export")
    rows = tuple(s.name for i, s in enumerate(outputs) if i != 1)
    version.model_class = per_image(version.model_class, outputs[1].name, rows)
    version.context = dataclasses.replace(version.context, outputs=tuple(
        s if i == 1 else dataclasses.replace(s, shape=(-1, -1, *s.shape[1:])) for i, s in enumerate(outputs)))


def _annotation(annotation: Any) -> str:
    """A setting's annotation as text, ``Optional``, ``Union`` and ``Annotated`` unwrapped to the names of
    what they hold (``Union[float, dict, NoneType]``), for ``protocol.paddlex.kind_of``."""
    import types
    import typing

    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _annotation(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return f"Union[{', '.join(_annotation(a) for a in typing.get_args(annotation))}]"
    if origin is not None:
        return getattr(origin, "__name__", str(origin))
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _settings(kind: str, pipeline) -> dict[str, str]:
    """The settings a request may send, each with its kind: those the pipeline object's ``predict`` names (but
    its input); where it passes what else it is given on to its model (``**kwargs``: the single-model
    pipelines), the fields of PaddleX serving's request for it too, which its app hands to ``predict``
    (``topk``, ``threshold``)."""
    # (PaddleX's image pipelines wrap the pipeline object that takes them in ``_pipeline``.)
    from .paddlex_pipeline import RENDERING

    parameters = inspect.signature(getattr(pipeline, "_pipeline", pipeline).predict).parameters
    table = {key: kind_of(_annotation(p.annotation)) for key, p in parameters.items()
             if key != "input" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    table |= RENDERING.get(kind, {})
    if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return table
    try:
        import importlib

        from paddlex.inference.serving.name_mappings import pipeline_name_to_mod_name

        schema = importlib.import_module(f"paddlex.inference.serving.schemas.{pipeline_name_to_mod_name(kind)}")
        fields = schema.InferRequest.model_fields
    except (ImportError, AttributeError, KeyError, ValueError):  # no app: predict's own names alone
        return table
    for field, info in fields.items():
        if field not in NOT_SETTINGS:
            table.setdefault(setting_name(field), kind_of(_annotation(info.annotation)))
    return table


def _close(pipeline) -> None:
    close = getattr(pipeline, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - a probe's runners hold nothing
            pass


def _load_yaml(name: str, path: Path) -> dict[str, Any]:
    import yaml  # pyyaml, the service's

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - any parse failure is the file's
        raise RepositoryError(name, path, f"not readable: {type(exc).__name__}: {exc}") from None
    if not isinstance(raw, dict):
        raise RepositoryError(name, path, f"expected PaddleX's pipeline settings (a mapping), got "
                              f"{type(raw).__name__}")
    return copy.deepcopy(raw)
