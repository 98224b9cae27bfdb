"""Reading a PaddleX OCR pipeline file (models/paddlex.py): its optional text-line orientation and document
preprocessor, as PaddleX reads the file (a switch left out is on), and each refusal naming the setting and
what to give."""

from __future__ import annotations

import shutil

import pytest
from support import standin_models, ocr_models, paddlex_reference, textline_model

from placeenv.serve.models import paddlex
from placeenv.serve.models.configs import RepositoryError

TEXTLINE = paddlex_reference.PIPELINE.with_name("ocr_textline_pipeline.yaml")
CLASSIFIER = "PP-LCNet_x0_25_textline_ori"
DOCPRE = paddlex_reference.DOCPRE_PIPELINE


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The six exports, as a user places them beside a pipeline file. Reading a file runs no network, so
    the text-line classifier's place holds the recogniser's program with the classifier's inference.yml
    (tests/e2e/test_paddlex_textline.py runs the trained one); the document preprocessor's and the
    detector are stand-ins (built in seconds)."""
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


def test_text_line_orientation_is_a_model_of_the_repository_with_the_files_batch_size(folder):
    entries, config, about = _read(folder, TEXTLINE.read_text())
    assert set(entries) == {"ocr.prepare", "ocr.TextDetection", "ocr.read", "ocr.TextLineOrientation",
                            "ocr.TextRecognition"}
    assert entries["ocr.TextLineOrientation"].max_batch_size == 6
    assert about["use_textline_orientation"] is True
    read = entries["ocr.read"].versions[1].context.parameters
    assert read["textline_model"] == "ocr.TextLineOrientation" and read["textline_batch_size"] == 6
    assert "textline_orientation_angles" in [o.name for o in config.outputs]


def test_a_switch_that_is_off_leaves_the_model_out(folder):
    entries, _, about = _read(folder, TEXTLINE.read_text().replace("use_textline_orientation: True",
                                                                   "use_textline_orientation: False"))
    assert "ocr.TextLineOrientation" not in entries
    assert about["use_textline_orientation"] is False
    assert entries["ocr.read"].versions[1].context.parameters["textline_model"] is None


def test_a_classifier_of_other_classes_is_refused_naming_them(folder, tmp_path):
    other = tmp_path / "four"
    shutil.copytree(folder / CLASSIFIER, other)
    (other / "inference.yml").write_text(textline_model.INFERENCE_YML.replace(
        "    - 180_degree\n", "    - 90_degree\n    - 180_degree\n    - 270_degree\n"))
    with pytest.raises(RepositoryError) as refused:
        _read(folder, TEXTLINE.read_text().replace("model_dir: PP-LCNet_x0_25_textline_ori", f"model_dir: {other}"))
    assert "2 classes" in str(refused.value) and "4 (0_degree, 90_degree, 180_degree, 270_degree)" in str(refused.value)


def test_a_batch_size_left_out_is_paddlexs_one(folder):
    entries, _, _ = _read(folder, TEXTLINE.read_text().replace("    batch_size: 6\n  TextRecognition",
                                                               "  TextRecognition"))
    assert entries["ocr.TextLineOrientation"].max_batch_size == paddlex.MODULE_BATCH_SIZE == 1


@pytest.mark.parametrize("change, says", [
    # Left out, PaddleX's switch is on: the file needs the SubModule, or the switch off.
    (("use_textline_orientation: True\n", ""), "SubModules has no TextLineOrientation"),
    (("use_textline_orientation: True", "use_textline_orientation: yes please"), "give True or False"),
    (("use_doc_preprocessor: False", "use_doc_preprocessor: True"), "SubPipelines has no DocPreprocessor"),
    (("    batch_size: 6\n  TextRecognition", "    batch_size: 0\n  TextRecognition"),
     "SubModules.TextLineOrientation: batch_size 0"),
    (("model_dir: PP-LCNet_x0_25_textline_ori", "model_dir: nowhere"), "inference.json, inference.pdiparams"),
    (("model_dir: PP-LCNet_x0_25_textline_ori", "model_dir: PP-OCRv5_mobile_det"),
     "a classifier's inference.yml (PreProcess ResizeImage, PostProcess Topk with topk)"),
    (("use_doc_preprocessor: False\n", ""), "set use_doc_preprocessor: False"),  # PaddleX's default: on
    (("use_doc_preprocessor: False", "use_doc_preprocessor: 1"), "use_doc_preprocessor 1: give True or False"),
])
def test_a_wrong_file_is_refused_naming_what_to_give(folder, change, says):
    text = TEXTLINE.read_text()
    if change[0].startswith("use_textline_orientation: True\n"):
        text = text.replace("  TextLineOrientation:\n    module_name: textline_orientation\n"
                            "    model_name: PP-LCNet_x0_25_textline_ori\n"
                            "    model_dir: PP-LCNet_x0_25_textline_ori\n    batch_size: 6\n", "")
    assert change[0] in text
    with pytest.raises(RepositoryError) as refused:
        _read(folder, text.replace(*change, 1))
    assert says in str(refused.value), str(refused.value)
    if "SubModules has no" in says:
        assert "use_textline_orientation: False" in str(refused.value)


def test_the_document_preprocessors_models_are_the_repositorys(folder):
    entries, config, about = _read(folder, DOCPRE.read_text())
    assert set(entries) == {"ocr.prepare", "ocr.DocOrientationClassify", "ocr.DocUnwarping", "ocr.TextDetection",
                            "ocr.read", "ocr.TextRecognition"}
    assert about["doc_preprocessor"] == {"use_doc_orientation_classify": True, "use_doc_unwarping": True}
    prepare = entries["ocr.prepare"].versions[1].context.parameters
    assert prepare["orientation_model"] == "ocr.DocOrientationClassify"
    assert prepare["unwarping_model"] == "ocr.DocUnwarping"
    assert entries["ocr.DocUnwarping"].max_batch_size == paddlex.MODULE_BATCH_SIZE
    assert "doc_preprocessor_angle" in [o.name for o in config.outputs]


def test_a_sub_pipeline_switch_that_is_off_leaves_its_model_out(folder):
    entries, _, about = _read(folder, DOCPRE.read_text().replace("use_doc_unwarping: True", "use_doc_unwarping: False"))
    assert "ocr.DocUnwarping" not in entries and "ocr.DocOrientationClassify" in entries
    assert about["doc_preprocessor"] == {"use_doc_orientation_classify": True, "use_doc_unwarping": False}
    assert entries["ocr.prepare"].versions[1].context.parameters["unwarping_model"] is None
    entries, _, about = _read(folder, DOCPRE.read_text().replace("use_doc_preprocessor: True",
                                                                 "use_doc_preprocessor: False"))
    assert about["doc_preprocessor"] is None and not {"ocr.DocUnwarping", "ocr.DocOrientationClassify"} & set(entries)


@pytest.mark.parametrize("change, says", [
    (("pipeline_name: doc_preprocessor", "pipeline_name: layout_parsing"),
     "SubPipelines has no DocPreprocessor with pipeline_name doc_preprocessor"),
    (("use_doc_unwarping: True", "use_doc_unwarping: maybe"),
     "SubPipelines.DocPreprocessor.use_doc_unwarping 'maybe': give True or False"),
    (("      DocUnwarping:\n        module_name: image_unwarping\n        model_name: UVDoc\n        model_dir: UVDoc\n",
      ""), "SubPipelines.DocPreprocessor.SubModules has no DocUnwarping"),
    (("model_dir: PP-LCNet_x1_0_doc_ori", f"model_dir: {CLASSIFIER}"),
     "SubPipelines.DocPreprocessor.SubModules.DocOrientationClassify: a DocOrientationClassify model answers 4 "
     "classes (0, 90, 180, 270)"),
    (("model_dir: UVDoc", "model_dir: nowhere"), "SubPipelines.DocPreprocessor.SubModules.DocUnwarping: model_dir"),
])
def test_a_wrong_document_preprocessor_is_refused_naming_what_to_give(folder, change, says):
    text = DOCPRE.read_text()
    assert change[0] in text
    with pytest.raises(RepositoryError) as refused:
        _read(folder, text.replace(*change, 1))
    assert says in str(refused.value), str(refused.value)
    if "SubPipelines has no" in says:  # and the switch that turns it off
        assert "or set use_doc_preprocessor: False" in str(refused.value)
    elif "has no" in says:
        assert "or set use_doc_unwarping: False in SubPipelines.DocPreprocessor" in str(refused.value)


def test_an_unwarping_model_that_does_not_answer_a_page_is_refused(folder):
    with pytest.raises(RepositoryError) as refused:  # the recogniser's export answers [N, T, classes]
        _read(folder, DOCPRE.read_text().replace("model_dir: UVDoc", "model_dir: PP-OCRv5_mobile_rec"))
    assert "DocUnwarping: " in str(refused.value) and "an unwarping model answers the page, [N, 3, H, W]" in \
        str(refused.value)


@pytest.mark.parametrize("change, says", [
    (("- '90'", "- '90_degree'"), "(0, 90_degree, 180, 270)"),
    (("  Topk:\n    topk: 1\n    label_list:\n    - '0'\n    - '90'\n    - '180'\n    - '270'\n", "  Topk:\n    topk: 1\n"),
     "has no label_list"),
    (("    topk: 1\n", ""), "PostProcess Topk with topk"),
])
def test_a_page_classifier_whose_classes_are_not_named_angles_is_refused(folder, tmp_path, change, says):
    other = tmp_path / "named"
    shutil.copytree(folder / standin_models.ORIENTATION, other)
    assert change[0] in standin_models.ORIENTATION_YML
    (other / "inference.yml").write_text(standin_models.ORIENTATION_YML.replace(*change))
    with pytest.raises(RepositoryError) as refused:
        _read(folder, DOCPRE.read_text().replace("model_dir: PP-LCNet_x1_0_doc_ori", f"model_dir: {other}"))
    assert says in str(refused.value), str(refused.value)


CLASSIFICATION = paddlex_reference.PIPELINE.with_name("image_classification_pipeline.yaml")


def test_an_image_classification_file_is_a_pipeline_of_three_steps(folder):
    entries, config, about = _read(folder, CLASSIFICATION.read_text())
    assert set(entries) == {"ocr.prepare", "ocr.ImageClassification", "ocr.top"}
    assert entries["ocr.ImageClassification"].max_batch_size == 4
    assert about == {"pipeline_name": "image_classification", "topk": 5}
    assert [o.name for o in config.outputs] == ["class_ids", "scores", "label_names"]
    assert [step.model for step in config.pipeline] == ["ocr.prepare", "ocr.ImageClassification", "ocr.top"]


DETECTION = paddlex_reference.PIPELINE.with_name("object_detection_pipeline.yaml")


def test_an_object_detection_file_is_a_pipeline_of_three_steps_feeding_the_exports_inputs(folder):
    entries, config, about = _read(folder, DETECTION.read_text())
    assert set(entries) == {"ocr.prepare", "ocr.ObjectDetection", "ocr.boxes"}
    detector = entries["ocr.ObjectDetection"]
    assert detector.max_batch_size == 4
    assert about == {"pipeline_name": "object_detection", "threshold": None}
    assert [o.name for o in config.outputs] == ["class_ids", "scores", "label_names", "coordinates"]
    prepare, detect, boxes = config.pipeline
    # PaddleX's ToBatch feeds a PicoDet the image and its scales, by position; the boxes come a row an image.
    assert detect.inputs == {"image": "img", "scale_factor": "scale_factors"} and not detect.parameters
    assert [s.shape for s in detector.default.outputs] == [(-1, -1, 6), (-1,)]
    settings = entries["ocr.boxes"].versions[1].context.parameters
    assert settings["model_name"] == "PicoDet-S" and settings["settings"]["threshold"] is None
    for given in ({0: 0.7, 2: 1}, {}):  # (PaddleX's empty dict: every class at 0.5)
        _, _, about = _read(folder, DETECTION.read_text().replace("threshold: null", f"threshold: {given}"))
        assert about["threshold"] == given
    _, _, about = _read(folder, DETECTION.read_text().replace("threshold: null", "threshold: 1"))
    assert about["threshold"] == 1.0 and type(about["threshold"]) is float  # PaddleX's 1 would pass every box


@pytest.mark.parametrize("pipeline, change, says", [
    (CLASSIFICATION, ("  ImageClassification:", "  Classification:"), "SubModules has no ImageClassification"),
    (CLASSIFICATION, ("topk: 5", "topk: 0"), "SubModules.ImageClassification: topk 0: give a whole number from 1"),
    (CLASSIFICATION, ("model_dir: PP-LCNet_x1_0_doc_ori", "model_dir: PP-OCRv5_mobile_det"),
     "not a classifier's inference.yml"),
    (CLASSIFICATION, ("pipeline_name: image_classification", "pipeline_name: semantic_segmentation"),
     "pipeline_name 'semantic_segmentation' is not served here; served: OCR, image_classification, "
     "object_detection"),
    (DETECTION, ("  ObjectDetection:", "  Detection:"), "SubModules has no ObjectDetection"),
    (DETECTION, ("threshold: null", "threshold: 1.5"),
     "SubModules.ObjectDetection: threshold 1.5: give a number from 0 to 1"),
    (DETECTION, ("threshold: null", "threshold: {red: 0.5}"),
     "threshold {'red': 0.5}: give a number from 0 to 1, or per class"),
    (DETECTION, ("img_size: null", "img_size: [320]"),
     "img_size [320]: give a whole number of pixels, or [width, height]"),
    (DETECTION, ("batch_size: 4", "batch_size: 0"), "batch_size 0: give a whole number from 1 to 1024"),
    (DETECTION, ("model_dir: PicoDet-S", "model_dir: PP-LCNet_x1_0_doc_ori"), "is not a detector's inference.yml"),
    (DETECTION, ("img_size: null", "img_size: 640"),
     "PaddleX cannot build its processors: ValueError: img_size: PicoDet-S takes images of one size"),
    (DETECTION, ("model_name: PicoDet-S", "model_name: PP-YOLOE_plus-S"),
     "model_name 'PP-YOLOE_plus-S', but"),
    (DETECTION, ("threshold: null", "layout_merge_bboxes_mode: {0: bogus}"),
     "layout_merge_bboxes_mode {0: 'bogus'}: give union, large or small, or per class id one of them"),
    (DETECTION, ("threshold: null", "layout_unclip_ratio: {0: 1.5}"),
     "layout_unclip_ratio {0: 1.5}: give a number with a point, [width, height], or per class id [width, height]"),
])
def test_a_wrong_single_model_file_is_refused_naming_what_to_give(folder, pipeline, change, says):
    text = pipeline.read_text()
    assert change[0] in text
    with pytest.raises(RepositoryError) as refused:
        _read(folder, text.replace(*change, 1))
    assert says in str(refused.value), str(refused.value)


def test_a_detector_that_does_not_answer_paddledetections_boxes_is_refused(folder, tmp_path):
    other = tmp_path / "one-input"
    shutil.copytree(folder / standin_models.ORIENTATION, other)
    shutil.copyfile(folder / standin_models.DETECTION / "inference.yml", other / "inference.yml")
    with pytest.raises(RepositoryError) as refused:
        _read(folder, DETECTION.read_text().replace("model_dir: PicoDet-S", f"model_dir: {other}"))
    assert "takes 1 inputs and answers 1 (x [-1, 3, 224, 224]" in str(refused.value)
    assert "instance segmentation's masks are not served" in str(refused.value)
    assert "a PaddleDetection export takes the image and its scale factor" in str(refused.value)
