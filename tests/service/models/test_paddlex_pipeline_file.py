"""Reading a PaddleX pipeline file (models/paddlex.py): PaddleX's own pipeline object is built from it once,
and the modules PaddleX builds are the models served (its switches, sub-pipelines and defaults decide), one
mechanism for every pipeline; what PaddleX refuses of the file, and what the service cannot run, is refused
at start, naming where in the file."""

from __future__ import annotations

import shutil

import pytest
from support import ocr_models, paddlex_reference, standin_models, textline_model

from placeenv.serve.models import paddlex
from placeenv.serve.models.configs import RepositoryError

TEXTLINE = paddlex_reference.PIPELINE.with_name("ocr_textline_pipeline.yaml")
CLASSIFIER = "PP-LCNet_x0_25_textline_ori"
DOCPRE = paddlex_reference.DOCPRE_PIPELINE
CLASSIFICATION = paddlex_reference.PIPELINE.with_name("image_classification_pipeline.yaml")
DETECTION = paddlex_reference.PIPELINE.with_name("object_detection_pipeline.yaml")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The exports, as a user places them beside a pipeline file. Reading a file runs no network, so the
    text-line classifier's place holds the recogniser's program with the classifier's inference.yml
    (tests/e2e/test_paddlex_textline.py runs the trained one); the others are stand-ins."""
    directory = tmp_path_factory.mktemp("ocr")
    for kind in ("det", "rec"):
        shutil.copytree(ocr_models.models()[kind], directory / ocr_models.NAMES[kind])
    shutil.copytree(ocr_models.models()["rec"], directory / CLASSIFIER)
    (directory / CLASSIFIER / "inference.yml").write_text(textline_model.INFERENCE_YML)
    for name in (standin_models.ORIENTATION, standin_models.UNWARPING, standin_models.DETECTION):
        standin_models.copy_to(name, directory / name)
    return directory


def _read(folder, text: str):
    path = folder / "pipeline.yaml"
    path.write_text(text)
    return paddlex.read("ocr", path, 8, 5.0)


def _refused(folder, text: str) -> str:
    with pytest.raises(RepositoryError) as refused:
        _read(folder, text)
    return str(refused.value)


def test_the_models_are_the_modules_paddlex_builds_and_one_cpu_step_runs_paddlexs_pipeline(folder):
    entries, config, about = _read(folder, TEXTLINE.read_text())
    assert set(entries) == {"ocr.pipeline", "ocr.TextDetection", "ocr.TextLineOrientation", "ocr.TextRecognition"}
    assert [step.model for step in config.pipeline] == ["ocr.pipeline"]
    assert entries["ocr.TextLineOrientation"].max_batch_size == 6 and entries["ocr.TextRecognition"].max_batch_size == 6
    # A request's calls come one after another: a batch goes as soon as a worker is free.
    assert {entries[m].max_batch_delay_ms for m in entries} == {0.0}
    assert about["pipeline_name"] == "OCR"
    assert about["settings"]["use_textline_orientation"] == "bool" and about["settings"]["text_det_thresh"] == "number"
    assert [o.name for o in config.outputs][:2] == ["result", "rec_texts"]
    step = entries["ocr.pipeline"]
    assert [g.kind for g in step.config.instance_group] == ["cpu"]
    assert step.config.instance_group[0].count == paddlex.CPU_WORKERS
    links = step.versions[1].context.parameters["links"]
    assert links["SubModules.TextDetection"].model == "ocr.TextDetection" and not links["SubModules.TextDetection"].counts


def test_a_switch_that_is_off_leaves_the_model_out_as_paddlex_builds_none(folder):
    entries, _, _ = _read(folder, TEXTLINE.read_text().replace("use_textline_orientation: True",
                                                               "use_textline_orientation: False"))
    assert "ocr.TextLineOrientation" not in entries


def test_a_batch_size_left_out_is_paddlexs_one(folder):
    entries, _, _ = _read(folder, TEXTLINE.read_text().replace("    batch_size: 6\n  TextRecognition",
                                                               "  TextRecognition"))
    assert entries["ocr.TextLineOrientation"].max_batch_size == paddlex.MODULE_BATCH_SIZE == 1


def test_the_document_preprocessors_models_are_the_repositorys(folder):
    entries, _, _ = _read(folder, DOCPRE.read_text())
    assert set(entries) == {"ocr.pipeline", "ocr.DocOrientationClassify", "ocr.DocUnwarping", "ocr.TextDetection",
                            "ocr.TextRecognition"}
    entries, _, _ = _read(folder, DOCPRE.read_text().replace("use_doc_unwarping: True", "use_doc_unwarping: False"))
    assert "ocr.DocUnwarping" not in entries and "ocr.DocOrientationClassify" in entries
    entries, _, _ = _read(folder, DOCPRE.read_text().replace("use_doc_preprocessor: True",
                                                             "use_doc_preprocessor: False"))
    assert not {"ocr.DocUnwarping", "ocr.DocOrientationClassify"} & set(entries)


def test_an_export_used_twice_is_one_model(folder):
    text = DOCPRE.read_text().replace("model_dir: UVDoc", "model_dir: PP-LCNet_x1_0_doc_ori").replace(
        "model_name: UVDoc", "model_name: PP-LCNet_x1_0_doc_ori").replace("module_name: image_unwarping",
                                                                          "module_name: doc_text_orientation")
    # (PaddleX builds it under both keys; its answers would be nonsense, but reading runs no network.)
    entries, _, _ = _read(folder, text)
    step = entries["ocr.pipeline"].versions[1].context.parameters["links"]
    keys = ("SubPipelines.DocPreprocessor.SubModules.DocOrientationClassify",
            "SubPipelines.DocPreprocessor.SubModules.DocUnwarping")
    assert step[keys[0]].model == step[keys[1]].model == "ocr.DocOrientationClassify"
    assert "ocr.DocUnwarping" not in entries


def test_single_model_files_and_a_detectors_boxes_a_row_an_image(folder):
    entries, config, about = _read(folder, CLASSIFICATION.read_text())
    assert set(entries) == {"ocr.pipeline", "ocr.ImageClassification"}
    assert entries["ocr.ImageClassification"].max_batch_size == 4 and about["settings"] == {"topk": "int"}
    assert [o.name for o in config.outputs] == ["result", "class_ids", "scores", "label_names"]
    entries, config, about = _read(folder, DETECTION.read_text())
    detector = entries["ocr.ObjectDetection"]
    assert [s.shape for s in detector.default.outputs] == [(-1, -1, 6), (-1,)]
    link = entries["ocr.pipeline"].versions[1].context.parameters["links"]["SubModules.ObjectDetection"]
    assert link.counts and link.inputs == ("image", "scale_factor")  # PaddleX's order: the sorted names
    assert "threshold" in about["settings"]


@pytest.mark.parametrize("pipeline, change, says", [
    # Left out, PaddleX's switch is on: the file needs the SubModule (PaddleX's own refusal).
    (TEXTLINE, ("model_dir: PP-LCNet_x0_25_textline_ori", "model_dir: nowhere"),
     "SubModules.TextLineOrientation: model_dir 'nowhere' holds no PaddleX export"),
    (TEXTLINE, ("    model_dir: PP-LCNet_x0_25_textline_ori\n", ""),
     "SubModules.TextLineOrientation: no model_dir: give the directory of its PaddleX export"),
    (TEXTLINE, ("    batch_size: 6\n  TextRecognition", "    batch_size: 0\n  TextRecognition"),
     "SubModules.TextLineOrientation: batch_size 0: give a whole number from 1 to 1024"),
    (DOCPRE, ("model_dir: UVDoc", "model_dir: nowhere"),
     "SubPipelines.DocPreprocessor.SubModules.DocUnwarping: model_dir 'nowhere' holds no PaddleX export"),
    (CLASSIFICATION, ("pipeline_name: image_classification", "pipeline_name: no_such_pipeline"),
     "'no_such_pipeline'"),
    (CLASSIFICATION, ("pipeline_name: image_classification\n", ""), "no pipeline_name"),
    (CLASSIFICATION, ("pipeline_name: image_classification", "pipeline_name: ts_classification"),
     "pipeline_name ts_classification: its input is a time series (CSV) whose result the service does not answer "
     "yet; the service serves PaddleX's pipelines that read an image, and ts_forecast"),
    (DETECTION, ("model_name: PicoDet-S", "model_name: PP-YOLOE_plus-S"), "PaddleX could not build"),
])
def test_a_wrong_file_is_refused_naming_where(folder, pipeline, change, says):
    text = pipeline.read_text()
    assert change[0] in text
    problem = _refused(folder, text.replace(*change, 1))
    assert says in problem, problem


def _renamed(folder, tmp_path, model_name: str) -> str:
    """The page classifier's export under another model's name (its inference.yml's Global.model_name too)."""
    other = tmp_path / model_name
    shutil.copytree(folder / standin_models.ORIENTATION, other)
    yml = other / "inference.yml"
    assert f"model_name: {standin_models.ORIENTATION}" in yml.read_text()
    yml.write_text(yml.read_text().replace(f"model_name: {standin_models.ORIENTATION}", f"model_name: {model_name}"))
    return CLASSIFICATION.read_text().replace(f"model_name: {standin_models.ORIENTATION}", f"model_name: {model_name}") \
        .replace(f"model_dir: {standin_models.ORIENTATION}", f"model_dir: {other}")


@pytest.mark.parametrize("model_name, says", [
    # A document VLM PaddleX runs in dygraph only: no runner of it could reach the devices.
    ("PP-DocBee-2B", "it has no Paddle Inference export (PaddleX runs it with paddle_dynamic)"),
    ("NoSuchModel", "it is no model PaddleX runs itself"),
])
def test_a_module_the_service_cannot_run_is_refused_naming_it(folder, tmp_path, model_name, says):
    problem = _refused(folder, _renamed(folder, tmp_path, model_name))
    assert f"SubModules.ImageClassification: {model_name} is not served here: {says}" in problem, problem


def test_a_detector_that_does_not_answer_paddledetections_boxes_is_refused(folder, tmp_path):
    other = tmp_path / "one-input"
    shutil.copytree(folder / standin_models.ORIENTATION, other)
    shutil.copyfile(folder / standin_models.DETECTION / "inference.yml", other / "inference.yml")
    problem = _refused(folder, DETECTION.read_text().replace("model_dir: PicoDet-S", f"model_dir: {other}"))
    assert "a PaddleDetection export answers its boxes [M, 6] and their count an image [N]" in problem, problem


@pytest.mark.parametrize("settings, backend", [
    ("", "auto"),  # nothing names a runtime: measured
    ("    engine_config:\n      run_mode: paddle\n", "auto"),  # how Paddle Inference runs, not which runtime
    ("    engine: onnxruntime\n", "onnxruntime"),
    ("    engine: openvino\n", "openvino"),
    ("    engine: paddle_static\n", "inference"),
    ("    engine: paddle\n", "inference"),
    ("    engine: paddle_dynamic\n", "jit"),
    ("    use_hpip: true\n    hpi_config:\n      backend: openvino\n", "openvino"),
    ("    engine: hpi\n    hpi_config:\n      backend: onnxruntime\n", "onnxruntime"),
    ("    use_hpip: true\n", "auto"),  # HPI chooses by its table: the service measures instead
    ("    use_hpip: false\n    hpi_config:\n      backend: openvino\n", "auto"),  # the control: HPI off
])
def test_a_runtime_the_file_names_is_obeyed_else_the_service_measures(folder, settings, backend):
    text = paddlex_reference.PIPELINE.read_text()
    anchor = "    model_name: PP-OCRv5_mobile_rec\n"
    assert anchor in text
    entries, _, _ = _read(folder, text.replace(anchor, anchor + settings, 1))
    assert entries["ocr.TextRecognition"].config.backend == backend
    assert entries["ocr.TextDetection"].config.backend == "auto"  # the other module: its own settings


def test_a_pipelines_engine_is_its_modules_unless_one_names_its_own(folder):
    text = "engine: openvino\n" + paddlex_reference.PIPELINE.read_text().replace(
        "    model_name: PP-OCRv5_mobile_rec\n", "    model_name: PP-OCRv5_mobile_rec\n    engine: onnxruntime\n", 1)
    entries, _, _ = _read(folder, text)
    assert entries["ocr.TextDetection"].config.backend == "openvino"
    assert entries["ocr.TextRecognition"].config.backend == "onnxruntime"


@pytest.mark.parametrize("settings, says", [
    ("    engine: tensorrt_llm\n", "SubModules.TextRecognition: engine 'tensorrt_llm' is not served here"),
    ("    use_hpip: true\n    hpi_config:\n      backend: om\n",
     "SubModules.TextRecognition: hpi_config backend 'om' is not served here"),
])
def test_a_runtime_the_service_does_not_have_is_refused_naming_where(folder, settings, says):
    anchor = "    model_name: PP-OCRv5_mobile_rec\n"
    problem = _refused(folder, paddlex_reference.PIPELINE.read_text().replace(anchor, anchor + settings, 1))
    assert says in problem, problem
