"""Reading a PaddleX OCR pipeline file (models/paddlex.py): its optional text-line orientation, as PaddleX
reads the file (a switch left out is on), and each refusal naming the setting and what to give."""

from __future__ import annotations

import shutil

import pytest
from support import ocr_models, paddlex_reference, textline_model

from placeenv.serve.models import paddlex
from placeenv.serve.models.configs import RepositoryError

TEXTLINE = paddlex_reference.PIPELINE.with_name("ocr_textline_pipeline.yaml")
CLASSIFIER = "PP-LCNet_x0_25_textline_ori"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The three exports, as a user places them beside a pipeline file. Reading a file runs no network, so
    the text-line classifier's place holds the recogniser's program with the classifier's inference.yml
    (tests/e2e/test_paddlex_textline.py runs the trained one)."""
    directory = tmp_path_factory.mktemp("ocr")
    for kind in ("det", "rec"):
        shutil.copytree(ocr_models.models()[kind], directory / ocr_models.NAMES[kind])
    shutil.copytree(ocr_models.models()["rec"], directory / CLASSIFIER)
    (directory / CLASSIFIER / "inference.yml").write_text(textline_model.INFERENCE_YML)
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
    assert about["use_textline_orientation"] is True and about["textline_orientation"] is True
    read = entries["ocr.read"].versions[1].context.parameters
    assert read["textline_model"] == "ocr.TextLineOrientation" and read["textline_batch_size"] == 6
    assert "textline_orientation_angles" in [o.name for o in config.outputs]


def test_a_switch_that_is_off_leaves_the_model_out(folder):
    entries, _, about = _read(folder, TEXTLINE.read_text().replace("use_textline_orientation: True",
                                                                   "use_textline_orientation: False"))
    assert "ocr.TextLineOrientation" not in entries
    assert about["textline_orientation"] is False
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
    (("use_doc_preprocessor: False", "use_doc_preprocessor: True"), "set use_doc_preprocessor: False"),
    (("    batch_size: 6\n  TextRecognition", "    batch_size: 0\n  TextRecognition"),
     "SubModules.TextLineOrientation: batch_size 0"),
    (("model_dir: PP-LCNet_x0_25_textline_ori", "model_dir: nowhere"), "inference.json, inference.pdiparams"),
    (("model_dir: PP-LCNet_x0_25_textline_ori", "model_dir: PP-OCRv5_mobile_det"),
     "a classifier's inference.yml (PreProcess ResizeImage, PostProcess Topk)"),
    (("use_doc_preprocessor: False\n", ""), "set use_doc_preprocessor: False"),  # PaddleX's default: on
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
