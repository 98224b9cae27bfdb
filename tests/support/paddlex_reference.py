"""PaddleX's own OCR pipeline, run from a virtual environment of its own, as the reference the
service's OCR must agree with (issue 44), and PaddleX's serving for the benchmark.

``python()`` makes once, under ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``placeenv/paddlex-<version>-ocr/``,
a venv with the CPU paddlepaddle, paddleocr and paddlex (its ocr extra) at the pinned versions below, plus PaddleX
serving's dependencies (``paddlex --install serving``: a plain pip install of the ``serving`` extra,
from PyPI). The marker file ``complete`` is written last; a venv without it (a make that was cut off)
is removed and made again. An ``flock`` beside it lets concurrent callers (pytest-xdist) wait for one
make. Everything comes from PyPI: pip by name.

``models()`` is the folder of PaddleOCR's PP-OCRv5_mobile det/rec exports (``ocr_models``).

``pipeline_file(directory)`` writes ``ocr_pipeline.yaml`` (beside this file) with its relative
``model_dir`` entries made absolute against ``models()``, the file ``paddlex --pipeline`` takes.

``reference_ocr(pipeline_yaml, images)`` runs that pipeline in the venv, in a subprocess (the
script ``RUNNER`` below), on encoded images (bytes) or paths, and returns per image
``rec_texts, rec_scores, rec_polys, rec_boxes, dt_polys``; ``run_reference`` also returns the
seconds each image took and the pipeline's creation time. ``reference_model`` runs a PaddleX model's
predictor (what its single-model pipelines, ``image_classification`` and ``object_detection``, run) the
same way, ``reference_classification`` the image classifier's. Both keep
PaddleX's answers under the venv (``answers/``), by the digest of every input of the run (the runner, the
pipeline file with its exports' files, the images, the fields) and of the venv's marker: the same inputs
get PaddleX's same answer without a second PaddleX run, and any change (a page drawn differently by
another Pillow, an export, PaddleX's venv) runs PaddleX again. ``serve(pipeline_yaml, port)`` starts
``paddlex --serve --pipeline FILE --port P``.

Nothing here skips: what is missing is an ``Unavailable`` that says what to install.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.documents import pdf_of  # noqa: F401 - the tests' PDFs, as the load test makes them

from . import ocr_models

PADDLEPADDLE = "3.3.1"
PADDLEOCR = "3.7.0"
PADDLEX = "3.7.2"
PIPELINE = Path(__file__).resolve().with_name("ocr_pipeline.yaml")
#: The OCR file with text-line orientation on, and the classifier's folder name it gives.
TEXTLINE_PIPELINE = PIPELINE.with_name("ocr_textline_pipeline.yaml")
TEXTLINE_MODEL = "PP-LCNet_x0_25_textline_ori"
DOCPRE_PIPELINE = PIPELINE.with_name("ocr_docpre_pipeline.yaml")
MARKER = "complete"

#: Per image, what reference_ocr returns (the pipeline result's JSON fields of the same names).
FIELDS = ("rec_texts", "rec_scores", "rec_polys", "rec_boxes", "dt_polys")

#: The agreement asked of the service's answers (issue 44): polygons within 2 px, scores within 0.01.
POLY_PX = 2
SCORE = 0.01

#: PaddleX's settings for the reference runs: the model directories are local (no model-hoster
#: check, which would reach the network), PaddleX's own cache stays inside ours.
PADDLEX_ENVIRONMENT = {"PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK": "True"}


class Unavailable(RuntimeError):
    """The reference cannot be had here; the message says what is missing."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "placeenv"


def venv_dir() -> Path:
    return cache_root() / f"paddlex-{PADDLEX}-ocr"


@contextlib.contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(args: list[str], what: str, timeout: float = 3600, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise Unavailable(f"{what}: {error}") from error
    if done.returncode != 0:
        raise Unavailable(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-1500:]}")
    return done


def _made(target: Path, make) -> Path:
    """The interpreter of the venv at ``target``, ``make(target)`` run first where the venv has no ``MARKER``
    (under a file lock; a venv left half-made is made anew), which then holds what it returned."""
    interpreter = target / "bin" / "python"
    if (target / MARKER).is_file():
        return interpreter
    with locked(target.with_name(target.name + ".lock")):
        if (target / MARKER).is_file():
            return interpreter
        shutil.rmtree(target, ignore_errors=True)  # a make that did not finish
        _run([sys.executable, "-m", "venv", str(target)],
             "python3 -m venv (Debian: apt-get install python3-venv)", timeout=600)
        (target / MARKER).write_text(json.dumps(make(target)) + "\n")
    return interpreter


def python() -> Path:
    """The reference venv's interpreter, the venv made on first use (several minutes, about 1.5 GB)."""

    def make(target: Path) -> dict:
        started = time.monotonic()
        pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        # (paddlex's ocr extra: its document pipelines, PP-StructureV3's among them)
        _run([*pip, f"paddlepaddle=={PADDLEPADDLE}", f"paddleocr=={PADDLEOCR}", f"paddlex[ocr]=={PADDLEX}"],
             f"pip install paddlepaddle=={PADDLEPADDLE} paddleocr=={PADDLEOCR} paddlex[ocr]=={PADDLEX} "
             f"(from PyPI, into {target})")
        _run([str(target / "bin" / "paddlex"), "--install", "serving"],
             f"paddlex --install serving (PaddleX serving's dependencies, from PyPI, into {target})")
        return {"paddlepaddle": PADDLEPADDLE, "paddleocr": PADDLEOCR, "paddlex": PADDLEX,
                "seconds_to_make": round(time.monotonic() - started, 1)}

    return _made(venv_dir(), make)


#: What ``paddlex[cv]`` adds to the reference venv: PaddleX's vision pipelines (object_detection, ...)
#: refuse to start without them, though their predictors use none.
CV_EXTRA = ("faiss-cpu", "matplotlib", "pycocotools<=2.0.8", "scikit-image")


#: What ``paddlex[ts]`` adds: PaddleX's time-series pipelines refuse to start without them.
TS_EXTRA = ("chinese-calendar", "joblib", "matplotlib", "scikit-learn")


def cv_python() -> Path:
    """An interpreter that sees the reference venv and ``CV_EXTRA`` too (``extra_python``), for ``paddlex
    --serve`` of a vision pipeline (benchmarks/paddlex_serving.py --detection)."""
    return extra_python("cv", CV_EXTRA)


def extra_python(extra: str, packages: tuple[str, ...]) -> Path:
    """An interpreter that sees the reference venv (its site-packages by a ``.pth``) and ``packages`` too (what
    ``paddlex[extra]`` adds); made on first use, beside the reference venv, which it leaves as it is."""
    reference = python()

    def make(target: Path) -> dict:
        def site(interpreter: Path) -> Path:
            return Path(_run([str(interpreter), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             f"{interpreter}'s site-packages").stdout.strip())

        (site(target / "bin" / "python") / "paddlex-reference.pth").write_text(f"{site(reference)}\n")
        _run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              *packages], f"pip install {' '.join(packages)} (paddlex[{extra}], from PyPI, into {target})")
        return {"over": str(venv_dir()), "packages": packages}

    return _made(venv_dir().with_name(f"{venv_dir().name}-{extra}"), make)


def models() -> Path:
    """The folder that holds PP-OCRv5_mobile_det and PP-OCRv5_mobile_rec (``ocr_models``, fetched on first
    use)."""
    return ocr_models.models()["det"].parent


def pipeline_file(directory: Path | str, models_dir: Path | str | None = None,
                  template: Path | str = PIPELINE) -> Path:
    """``template`` (PaddleX OCR pipeline YAML) written into ``directory`` with each relative
    ``model_dir:`` made absolute against ``models_dir`` (default: ``models()``)."""
    base = Path(models_dir) if models_dir is not None else models()
    lines = []
    for line in Path(template).read_text().splitlines(keepends=True):
        key, sep, value = line.partition("model_dir:")
        value = value.strip()
        if sep and not key.strip() and value and value not in ("null", "~") and not Path(value).is_absolute():
            resolved = base / value
            if not resolved.is_dir():
                raise Unavailable(f"{template}: model_dir {value} is not a folder under {base}")
            line = f"{key}model_dir: {resolved}\n"
        lines.append(line)
    out = Path(directory) / Path(template).name
    out.write_text("".join(lines))
    return out


def place_textline_models(directory: Path) -> Path:
    """The three exports ``TEXTLINE_PIPELINE`` names, in ``directory`` (made): PP-OCRv5_mobile det and rec,
    and the text-line classifier ``textline_model`` trains."""
    from . import textline_model  # (imported here: it takes this module's lock)

    for kind in ("det", "rec"):
        shutil.copytree(ocr_models.models()[kind], Path(directory) / ocr_models.NAMES[kind])
    textline_model.copy_to(Path(directory) / TEXTLINE_MODEL)
    return Path(directory)


def textline_pipeline_file(directory: Path | str, batch_size: int = 6) -> Path:
    """``TEXTLINE_PIPELINE`` for PaddleX, in ``directory``: its exports placed in ``directory/models``, its
    ``model_dir`` entries absolute, the classifier's ``batch_size`` set (PaddleX answers each crop's own
    class only with 1: tests/e2e/test_paddlex_textline.py)."""
    directory = Path(directory)
    models = place_textline_models(directory / "models")
    template = directory / "template" / TEXTLINE_PIPELINE.name
    template.parent.mkdir(parents=True, exist_ok=True)
    template.write_text(TEXTLINE_PIPELINE.read_text().replace(
        "    batch_size: 6\n  TextRecognition", f"    batch_size: {batch_size}\n  TextRecognition"))
    return pipeline_file(directory, models, template=template)


def place_docpre_models(directory: Path) -> Path:
    """The four exports ``DOCPRE_PIPELINE`` names, in ``directory`` (made): PP-OCRv5_mobile det and rec, and
    the document preprocessor's two stand-ins (``standin_models``)."""
    from . import standin_models  # (imported here: it takes this module's lock)

    for kind in ("det", "rec"):
        shutil.copytree(ocr_models.models()[kind], Path(directory) / ocr_models.NAMES[kind])
    for name in (standin_models.ORIENTATION, standin_models.UNWARPING):
        standin_models.copy_to(name, Path(directory) / name)
    return Path(directory)


def environment() -> dict[str, str]:
    """The environment PaddleX runs in: this process's, with PADDLEX_ENVIRONMENT and PaddleX's own
    cache (PADDLE_PDX_CACHE_HOME) inside the venv's folder."""
    return {**os.environ, **PADDLEX_ENVIRONMENT, "PADDLE_PDX_CACHE_HOME": str(venv_dir() / "paddlex-home")}


#: The script reference_ocr runs in the venv: argv is the pipeline YAML, a JSON list of image paths
#: and the JSON file to write. The first image is also run once before the timed runs (the
#: predictors' first run builds their programs), so ``seconds`` is a steady page's time.
RUNNER = r'''
import json, sys, time
started = time.perf_counter()
from paddlex import create_pipeline
pipeline = create_pipeline(pipeline=sys.argv[1], device="cpu")
created = time.perf_counter() - started
paths = json.loads(sys.argv[2])
fields = json.loads(sys.argv[4])
if paths:
    list(pipeline.predict(paths[0]))
results, seconds = [], []
for path in paths:
    begun = time.perf_counter()
    (result,) = list(pipeline.predict(path))
    seconds.append(time.perf_counter() - begun)
    res = result.json["res"]
    results.append({key: res.get(key) for key in fields})
with open(sys.argv[3], "w") as out:
    json.dump({"results": results, "seconds": seconds, "create_seconds": created}, out)
'''


def run_reference(pipeline_yaml: Path | str, images: list[bytes | Path | str], timeout: float = 1800,
                  fields: tuple[str, ...] = FIELDS) -> dict:
    """PaddleX's pipeline on ``images`` (encoded bytes or paths): ``{"results": [per image fields],
    "seconds": [per image, after one warm-up run], "create_seconds": pipeline creation}``."""
    interpreter = python()
    with tempfile.TemporaryDirectory(prefix="paddlex-reference-") as scratch:
        paths = []
        for i, image in enumerate(images):
            if isinstance(image, (bytes, bytearray)):
                suffix = ".png" if image[:8] == b"\x89PNG\r\n\x1a\n" else ".jpg"
                path = Path(scratch) / f"{i:04d}{suffix}"
                path.write_bytes(image)
            else:
                path = Path(image)
            paths.append(str(path))
        out = Path(scratch) / "out.json"
        script = Path(scratch) / "runner.py"
        script.write_text(RUNNER)
        _run([str(interpreter), str(script), str(pipeline_yaml), json.dumps(paths), str(out), json.dumps(fields)],
             f"PaddleX {PADDLEX}'s pipeline {pipeline_yaml} in {venv_dir()}", timeout=timeout, env=environment())
        return json.loads(out.read_text())


def reference_ocr(pipeline_yaml: Path | str, images: list[bytes | Path | str], timeout: float = 1800,
                  fields: tuple[str, ...] = FIELDS) -> list[dict]:
    """Per image, PaddleX's ``rec_texts, rec_scores, rec_polys, rec_boxes, dt_polys`` (JSON), or ``fields``:
    PaddleX's answers for exactly these inputs, kept (``_kept``)."""
    pipeline_yaml = Path(pipeline_yaml)
    return _kept([RUNNER, _pipeline_text(pipeline_yaml), json.dumps(fields), *map(_content, images)],
                 lambda: run_reference(pipeline_yaml, images, timeout, fields)["results"])


#: The script reference_pdf runs in the venv: argv is the pipeline YAML, the PDF's path, the fields (JSON) and
#: the JSON file to write. The pages are rendered as PaddleX serving renders a PDF (its app's read_pdf), and
#: the pipeline is given them as its app gives them.
PDF_RUNNER = r'''
import json, sys
from paddlex import create_pipeline
from paddlex.inference.serving.infra.utils import read_pdf
pipeline = create_pipeline(pipeline=sys.argv[1], device="cpu")
images, info = read_pdf(open(sys.argv[2], "rb").read())
fields = json.loads(sys.argv[3])
results = [{key: result.json["res"].get(key) for key in fields} for result in pipeline.predict(images)]
with open(sys.argv[4], "w") as out:
    json.dump({"results": results, "info": info.model_dump(mode="json")}, out)
'''


def reference_pdf(pipeline_yaml: Path | str, pdf: bytes, fields: tuple[str, ...] = FIELDS,
                  timeout: float = 1800) -> dict:
    """PaddleX serving's answer to a PDF, as its app makes it: the pages rendered by its ``read_pdf``, then
    PaddleX's pipeline on them: ``{"results": [per page fields], "info": its dataInfo}``; kept (``_kept``)."""
    pipeline_yaml = Path(pipeline_yaml)

    def compute() -> dict:
        with tempfile.TemporaryDirectory(prefix="paddlex-reference-") as scratch:
            path, out, script = Path(scratch) / "file.pdf", Path(scratch) / "out.json", Path(scratch) / "runner.py"
            path.write_bytes(pdf)
            script.write_text(PDF_RUNNER)
            _run([str(python()), str(script), str(pipeline_yaml), str(path), json.dumps(fields), str(out)],
                 f"PaddleX {PADDLEX}'s pipeline {pipeline_yaml} on a PDF in {venv_dir()}", timeout=timeout,
                 env=environment())
            return json.loads(out.read_text())

    return _kept([PDF_RUNNER, _pipeline_text(pipeline_yaml), json.dumps(fields), pdf_content(pdf)], compute)


def pdf_content(pdf: bytes) -> bytes:
    """``pdf`` without what PDFium writes anew into every file it saves (``pdf_of``'s too): the trailer's random
    file identifier (``/ID``) and the time of saving (``/CreationDate``, ``/ModDate``). What a reader renders
    depends on neither, and a kept answer keyed by them would never be found again."""
    pdf = re.sub(rb"/ID\s*\[\s*<[0-9A-Fa-f]*>\s*<[0-9A-Fa-f]*>\s*\]", b"/ID[]", pdf)
    return re.sub(rb"/(CreationDate|ModDate)\s*\([^()]*\)", rb"/\1()", pdf)


#: The script reference_documents runs in the venv: argv is the pipeline YAML, a JSON list of image paths and
#: the JSON file to write. Each page's answer as PaddleX serving's document apps make it: PaddleX's result,
#: pruned by its serving's prune_result, and (PP-StructureV3's) its Markdown with its app's defaults.
DOCUMENT_RUNNER = r'''
import json, sys
from paddlex import create_pipeline
from paddlex.inference.serving.basic_serving._pipeline_apps._common.common import prune_result
pipeline = create_pipeline(pipeline=sys.argv[1], device="cpu")
results = []
for path in json.loads(sys.argv[2]):
    (result,) = list(pipeline.predict(path))
    found = {"result": prune_result(result.json["res"])}
    if hasattr(result, "_to_markdown"):
        markdown = result._to_markdown(pretty=True, show_formula_number=False)
        found["markdown"] = {"text": markdown["markdown_texts"], "images": sorted(markdown["markdown_images"]),
                             "flags": list(markdown["page_continuation_flags"])}
    results.append(found)
with open(sys.argv[3], "w") as out:
    json.dump(results, out)
'''


def reference_documents(pipeline_yaml: Path | str, images: list[bytes], timeout: float = 1800) -> list[dict]:
    """PaddleX's document pipeline (PP-StructureV3, tables, seals, formulas) on encoded ``images``: per image
    ``{"result": PaddleX's result as its serving prunes it, "markdown": {text, images (their names), flags}}``
    (the Markdown where the result makes one); kept (``_kept``)."""
    pipeline_yaml = Path(pipeline_yaml)
    return _kept([DOCUMENT_RUNNER, _pipeline_text(pipeline_yaml), *images],
                 lambda: _run_files(DOCUMENT_RUNNER, python(), pipeline_yaml, images, ".png", timeout))


def _run_files(runner: str, interpreter: Path, pipeline_yaml: Path, files: list[bytes], suffix: str,
               timeout: float) -> Any:
    """The script ``runner`` in a PaddleX venv (``interpreter``), its argv the pipeline file, a JSON list of
    ``files`` written as paths (each ``suffix``) and the JSON file it writes: what it wrote."""
    with tempfile.TemporaryDirectory(prefix="paddlex-reference-") as scratch:
        paths = []
        for i, data in enumerate(files):
            paths.append(str(Path(scratch) / f"{i:04d}{suffix}"))
            Path(paths[-1]).write_bytes(data)
        out, script = Path(scratch) / "out.json", Path(scratch) / "runner.py"
        script.write_text(runner)
        _run([str(interpreter), str(script), str(pipeline_yaml), json.dumps(paths), str(out)],
             f"PaddleX {PADDLEX}'s pipeline {pipeline_yaml} in {interpreter.parents[1]}", timeout=timeout,
             env=environment())
        return json.loads(out.read_text())


def near(answer, expected, tolerance: float = POLY_PX, where: str = "") -> list[str]:
    """Where two JSON values differ: numbers by more than ``tolerance`` (coordinates within ``POLY_PX``; a
    score's 0.01 is within it too), anything else at all (texts, HTML, LaTeX, labels, the keys)."""
    if isinstance(expected, dict) and isinstance(answer, dict):
        if answer.keys() != expected.keys():
            return [f"{where or '.'}: keys {sorted(answer)} != {sorted(expected)}"]
        return [d for key in expected for d in near(answer[key], expected[key], tolerance, f"{where}.{key}")]
    if isinstance(expected, list) and isinstance(answer, list):
        if len(answer) != len(expected):
            return [f"{where}: {len(answer)} items != {len(expected)}"]
        return [d for i, (a, e) in enumerate(zip(answer, expected)) for d in near(a, e, tolerance, f"{where}[{i}]")]
    numbers = (int, float)
    if isinstance(expected, numbers) and isinstance(answer, numbers) and not isinstance(expected, bool):
        return [] if abs(answer - expected) <= tolerance else [f"{where}: {answer} != {expected}"]
    return [] if answer == expected else [f"{where}: {str(answer)[:80]!r} != {str(expected)[:80]!r}"]


def _content(image: bytes | Path | str) -> bytes:
    return bytes(image) if isinstance(image, (bytes, bytearray)) else Path(image).read_bytes()


def _pipeline_text(pipeline_yaml: Path) -> str:
    """The pipeline file with each ``model_dir`` given as its files' digest, not its (temporary) place."""
    lines = []
    for line in pipeline_yaml.read_text().splitlines():
        key, sep, value = line.partition("model_dir:")
        if sep and Path(value.strip()).is_dir():
            line = f"{key}model_dir: {_directory_digest(Path(value.strip()))}"
        lines.append(line)
    return "\n".join(lines)


def _directory_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _kept(inputs: list[str | bytes], compute):
    """``compute()``'s answer, kept under the reference venv by the digest of ``inputs`` (every input of the
    reference run: the runner, the pipeline file and its exports' files, the images, the fields asked) and of
    the venv's marker (a venv made anew answers anew). PaddleX's answer is a function of these alone, and a
    run costs a PaddleX start and a pass over the images: CI runs each once a machine."""
    python()  # the venv, made first: its marker is part of the key
    digest = hashlib.sha256((venv_dir() / MARKER).read_bytes())
    for part in inputs:
        data = part.encode() if isinstance(part, str) else part
        digest.update(hashlib.sha256(data).digest())
    kept = venv_dir() / "answers" / f"{digest.hexdigest()[:32]}.json"
    if kept.is_file():
        return json.loads(kept.read_text())
    found = compute()
    kept.parent.mkdir(parents=True, exist_ok=True)
    staging = kept.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps(found))
    os.replace(staging, kept)  # whole: a reader never sees half an answer
    return found


#: The script reference_model runs in the venv: argv is the model's name, its export directory, the
#: model's settings (JSON), a JSON list of [image path, predict's keyword arguments], the result's keys
#: (JSON) and the JSON file to write.
MODEL_RUNNER = r'''
import json, sys
from paddlex import create_model
model = create_model(model_name=sys.argv[1], model_dir=sys.argv[2], device="cpu", **json.loads(sys.argv[3]))
keys = json.loads(sys.argv[5])
results = []
for path, asked in json.loads(sys.argv[4]):
    (result,) = list(model.predict(path, **{k: {int(c): t for c, t in v.items()} if isinstance(v, dict) else v
                                            for k, v in asked.items()}))
    res = result.json["res"]
    results.append({key: res.get(key) for key in keys})
with open(sys.argv[6], "w") as out:
    json.dump(results, out)
'''


def reference_model(model_name: str, model_dir: Path | str, images: list[tuple[bytes, dict]], settings: dict,
                    keys: tuple[str, ...], timeout: float = 900) -> list[dict]:
    """PaddleX's model (``create_model`` with the file's ``settings``, what PaddleX's single-model pipelines
    run: the pipelines themselves need ``paddlex[cv]``, whose packages their predictors do not use) on
    encoded ``images``, each with its ``predict`` keyword arguments (a dict's keys are class ids): per image
    the result's ``keys``; kept (``_kept``)."""
    return _kept([MODEL_RUNNER, model_name, _directory_digest(Path(model_dir)), json.dumps(settings), json.dumps(keys),
                  *(part for image, asked in images for part in (image, json.dumps(asked, sort_keys=True)))],
                 lambda: _predict(model_name, model_dir, images, settings, keys, timeout))


def _predict(model_name: str, model_dir: Path | str, images: list[tuple[bytes, dict]], settings: dict,
             keys: tuple[str, ...], timeout: float) -> list[dict]:
    interpreter = python()
    with tempfile.TemporaryDirectory(prefix="paddlex-reference-") as scratch:
        asked = []
        for i, (image, kwargs) in enumerate(images):
            path = Path(scratch) / f"{i:04d}.png"
            path.write_bytes(image)
            asked.append([str(path), kwargs])
        out, script = Path(scratch) / "out.json", Path(scratch) / "runner.py"
        script.write_text(MODEL_RUNNER)
        _run([str(interpreter), str(script), model_name, str(model_dir), json.dumps(settings), json.dumps(asked),
              json.dumps(keys), str(out)], f"PaddleX {PADDLEX}'s {model_name} in {venv_dir()}", timeout=timeout,
             env=environment())
        return json.loads(out.read_text())


def reference_classification(model_name: str, model_dir: Path | str, images: list[tuple[bytes, int | None]],
                             topk: int | None = None, timeout: float = 900) -> list[dict]:
    """PaddleX's image classification model on encoded ``images``, each with a request's topk (None: none),
    the file's ``topk`` given to the model as the pipeline gives it: per image ``class_ids, scores,
    label_names``."""
    return reference_model(model_name, model_dir, [(image, {"topk": k}) for image, k in images],
                           {"topk": topk} if topk is not None else {}, ("class_ids", "scores", "label_names"),
                           timeout)


#: The script reference_forecast runs in the venv: argv is the pipeline YAML, a JSON list of CSV paths and the
#: JSON file to write. Each CSV is read and the forecast written as PaddleX serving's app reads and writes them.
TS_RUNNER = r'''
import json, sys
from paddlex import create_pipeline
from paddlex.inference.serving.basic_serving._pipeline_apps._common.common import prune_result
from paddlex.inference.serving.infra.utils import csv_bytes_to_data_frame, data_frame_to_bytes
pipeline = create_pipeline(pipeline=sys.argv[1], device="cpu")
results = []
for path in json.loads(sys.argv[2]):
    with open(path, "rb") as given:
        (result,) = list(pipeline.predict(csv_bytes_to_data_frame(given.read())))
    forecast = data_frame_to_bytes(result["forecast"]).decode()
    results.append({"result": prune_result(result.json["res"]), "csv": forecast})
with open(sys.argv[3], "w") as out:
    json.dump(results, out)
'''


def reference_forecast(pipeline_yaml: Path | str, series: list[bytes], timeout: float = 900) -> list[dict]:
    """PaddleX's time-series forecasting pipeline on each CSV of ``series``, as PaddleX serving runs it: per
    series its ``result`` (pruned as PaddleX serving prunes it) and the forecast's ``csv``; kept (``_kept``)."""
    pipeline_yaml = Path(pipeline_yaml)

    def compute() -> list[dict]:
        return _run_files(TS_RUNNER, extra_python("ts", TS_EXTRA), pipeline_yaml, series, ".csv", timeout)

    return _kept([TS_RUNNER, _pipeline_text(pipeline_yaml), *series], compute)


def serve_command(pipeline_yaml: Path | str, port: int, host: str = "127.0.0.1", cv: bool = False) -> list[str]:
    """``paddlex --serve`` for ``pipeline_yaml`` on the CPU, from the reference venv (``cv``: with
    ``paddlex[cv]``, ``cv_python``)."""
    program = ([str(cv_python()), "-c", "import sys; from paddlex.paddlex_cli import main; sys.argv[0] = 'paddlex'; "
                "sys.exit(main())"] if cv else [str(python().parent / "paddlex")])
    return [*program, "--serve", "--pipeline", str(pipeline_yaml), "--device", "cpu", "--host", host, "--port",
            str(port)]


def serve(pipeline_yaml: Path | str, port: int, host: str = "127.0.0.1", **popen) -> subprocess.Popen:
    """PaddleX serving (its FastAPI app under uvicorn) on ``host:port``; ``POST /ocr`` answers once
    the log says Uvicorn is running. The caller ends it (terminate, wait)."""
    return subprocess.Popen(serve_command(pipeline_yaml, port, host), env={**environment(), **popen.pop("env", {})},
                            **popen)


@contextlib.contextmanager
def served(repository: Path, models: str):
    """The service on ``repository``'s ``models``, on the CPU, until the block ends; its v2 over REST and over
    gRPC are ``targets(proc)``."""
    from .servers import ServiceProcess, free_port

    grpc_port = free_port()
    proc = ServiceProcess(devices="cpu", models=models, model_repository=repository, grpc_port=grpc_port)
    proc.grpc = f"grpc://127.0.0.1:{grpc_port}"
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@contextlib.contextmanager
def served_files(root: Path, files: dict[str, Path], place: Callable[[str, Path], Path]):
    """``served`` on a repository in ``root`` of PaddleX pipeline files: name -> its file, in the folder
    ``place(name, folder)`` fills with its exports."""
    for name, file in files.items():
        shutil.copyfile(file, place(name, Path(root) / name) / "pipeline.yaml")
    with served(Path(root), ",".join(files)) as proc:
        yield proc


def targets(proc) -> tuple[str, str]:
    """A ``served`` service's v2 targets for ``over_v2``: REST (host:port) and gRPC (grpc://host:port)."""
    return proc.url[len("http://"):], proc.grpc


@contextlib.contextmanager
def served_standin(root: Path, name: str, export: str, pipeline: Path):
    """The service on a repository in ``root`` of one pipeline, ``name``: the file ``pipeline`` over the stand-in
    ``export`` (standin_models.py), in the folder its ``model_dir`` names."""
    from . import standin_models  # (imported here: it takes this module's lock)

    standin_models.copy_to(export, Path(root) / name / export)
    shutil.copyfile(pipeline, Path(root) / name / "pipeline.yaml")
    with served(Path(root), name) as proc:
        yield proc


def together(proc, ask: Callable[[str, Any], Any], jobs: list, threads: int = 4) -> list:
    """``ask(target, job)`` for each of ``jobs``, ``threads`` in flight at once (their network calls batched
    across requests), alternately over v2 REST and over gRPC (a ``served`` service's ``targets``): the answers,
    in ``jobs``' order."""
    both = targets(proc)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda i: ask(both[i % 2], jobs[i]), range(len(jobs))))


def documents_as_paddlex(proc, model: str, inputs: list[bytes], reference: list[dict], path: str,
                         key: str) -> list[dict]:
    """A served document pipeline's results of ``inputs`` (``result``, as PaddleX serving prunes it) over v2,
    in flight together (``together``), each checked against PaddleX's (``reference_documents``' answers), and
    the first input's through PaddleX serving's own endpoint ``path`` (its result list ``key``) too: the
    v2 results."""
    import httpx

    def ask(target: str, data: bytes) -> dict:
        return json.loads(over_v2(target, model, data).as_numpy("result")[0])

    answers = together(proc, ask, inputs)
    for seed, (answer, expected) in enumerate(zip(answers, reference)):
        assert near(answer, expected["result"]) == [], f"{model} {seed}"
    body = {"file": base64.b64encode(inputs[0]).decode(), "fileType": 1}
    answer = httpx.post(f"{proc.url}{path}", json=body, timeout=300)
    assert answer.status_code == 200, answer.text[:500]
    (page,) = answer.json()["result"][key]
    assert near(page["prunedResult"], reference[0]["result"]) == []
    return answers


def over_v2(url: str, model: str, data: bytes, parameters: dict | None = None, given: str = "image"):
    """tritonclient's result of ``model`` (a served PaddleX pipeline) on one encoded image (or the file its input
    ``given`` takes) over v2 REST (``url``: host:port; its outputs binary) or, where ``url`` is grpc://host:port,
    over v2 gRPC."""
    if url.startswith("grpc://"):
        import tritonclient.grpc as tg

        image = tg.InferInput(given, [1], "BYTES")
        image.set_data_from_numpy(np.array([data], dtype=object))
        return tg.InferenceServerClient(url[len("grpc://"):]).infer(model, [image], parameters=parameters,
                                                                     client_timeout=120)
    import tritonclient.http as th

    client = th.InferenceServerClient(url, network_timeout=120)
    image = th.InferInput(given, [1], "BYTES")
    image.set_data_from_numpy(np.array([data], dtype=object), binary_data=True)
    return client.infer(model, [image], parameters=parameters)


def box_fields(boxes: list[dict]) -> dict[str, list]:
    """PaddleX's detected boxes (its result's ``boxes``) as the service's typed outputs hold them."""
    return {"class_ids": [b["cls_id"] for b in boxes], "scores": [b["score"] for b in boxes],
            "label_names": [b["label"] for b in boxes], "coordinates": [b["coordinate"] for b in boxes]}


def box_differences(answer: dict, expected: dict) -> list[str]:
    """What differs from PaddleX's detected boxes (``box_fields``) beyond the tolerances (nothing: [])."""
    if answer["class_ids"] != expected["class_ids"] or answer["label_names"] != expected["label_names"]:
        return [f"classes {answer['label_names']} != {expected['label_names']}"]
    found = []
    got, want = np.asarray(answer["coordinates"]).reshape(-1, 4), np.asarray(expected["coordinates"]).reshape(-1, 4)
    if got.size and np.abs(got - want).max() > POLY_PX:
        found.append(f"coordinates differ by {np.abs(got - want).max():.2f} px")
    scores = np.abs(np.asarray(answer["scores"]) - np.asarray(expected["scores"]))
    if scores.size and scores.max() > SCORE:
        found.append(f"scores differ by {scores.max():.4f}")
    return found


def same_classes(answer: dict, expected: dict) -> bool:
    """Whether a classifier's answer is PaddleX's: the same classes in the same order, scores within ``SCORE``."""
    return (answer["class_ids"] == expected["class_ids"] and answer["label_names"] == expected["label_names"]
            and np.allclose(answer["scores"], expected["scores"], atol=SCORE))


def as_lists(result, keys: tuple[str, ...]) -> dict[str, list]:
    """A tritonclient result's outputs ``keys`` as lists, BYTES elements decoded (UTF-8)."""
    return {key: [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy(key).tolist()]
            for key in keys}


def differences(answer: dict, expected: dict) -> list[str]:
    """What differs between an answer and PaddleX's beyond the tolerances (nothing: [])."""
    if list(answer["rec_texts"]) != list(expected["rec_texts"]):
        return [f"texts {answer['rec_texts']} != {expected['rec_texts']}"]
    found = []
    for key in ("rec_polys", "dt_polys", "rec_boxes"):
        got, want = np.asarray(answer[key], np.int64), np.asarray(expected[key], np.int64)
        if got.shape != want.shape or (got.size and np.abs(got - want).max() > POLY_PX):
            found.append(f"{key} differ: {got.tolist()[:2]} vs {want.tolist()[:2]}")
    scores = np.abs(np.asarray(answer["rec_scores"]) - np.asarray(expected["rec_scores"]))
    if scores.size and scores.max() > SCORE:
        found.append(f"scores differ by {scores.max():.4f}")
    return found
