"""PaddleX's table_recognition_v2, seal_recognition and formula_recognition pipelines, each served from its file
by the one mechanism with no code of its own, against PaddleX itself.

Each file is PaddleX's own with its layout detector and document preprocessor off, over PaddleOCR's PP-OCRv5
mobile exports and the stand-ins of the rest (tests/support/<pipeline>_pipeline.yaml; standin_tables.py,
standin_formula.py, standin_layout.py). The inputs are the stand-ins' own: tables (wired and not, of 2 to 4
rows and columns), seals, formulas, 8 of each. PaddleX's own pipeline on the same files and inputs is the
reference: each result as PaddleX serving prunes it, over v2 and over PaddleX serving's own endpoint. The
stand-ins are shown to read them (a table's cells, a seal's words, a formula's LaTeX); the control, a
recognition threshold no text passes, empties a table's cells.
"""

from __future__ import annotations

import base64

import cv2
import httpx
import pytest
from support import paddlex_reference, standin_formula, standin_layout, standin_models, standin_tables

COUNT = 8
#: Each pipeline: its repository name, its file, the exports it names, its endpoint and its result list's key.
PIPELINES = {
    "tables": ("table_recognition_v2", ("PP-LCNet_x1_0_table_cls", "SLANeXt_wired", "SLANeXt_wireless",
                                        "RT-DETR-L_wired_table_cell_det", "RT-DETR-L_wireless_table_cell_det",
                                        standin_layout.TABLE_ORIENTATION), "/table-recognition", "tableRecResults"),
    "seals": ("seal_recognition", ("PP-OCRv4_server_seal_det",), "/seal-recognition", "sealRecResults"),
    "formulas": ("formula_recognition", ("PP-FormulaNet_plus-L",), "/formula-recognition", "formulaRecResults"),
}


def _inputs(name: str) -> list[tuple[bytes, object]]:
    """Each input (PNG) and what it holds: a table's cells, a seal's words, a formula's LaTeX."""
    made = []
    for seed in range(COUNT):
        if name == "tables":
            image, held = standin_tables.table(seed, 360 + 70 * seed, 200 + 20 * seed, wired=seed % 2 == 0)
        elif name == "seals":
            image, held = standin_formula.seal(seed)
        else:
            image, held = standin_formula.formula(seed)
        made.append((cv2.imencode(".png", image)[1].tobytes(), held))
    return made


def _file(name: str):
    return paddlex_reference.PIPELINE.with_name(f"{PIPELINES[name][0]}_pipeline.yaml")


def _place(name: str, directory):
    return standin_models.place(directory, PIPELINES[name][1], ocr=name != "formulas")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with paddlex_reference.served_files(tmp_path_factory.mktemp("repository"),
                                        {name: _file(name) for name in PIPELINES}, _place) as proc:
        yield proc


@pytest.fixture(scope="module", params=list(PIPELINES))
def case(request, tmp_path_factory):
    """A pipeline's name, inputs and PaddleX's answers to them."""
    name = request.param
    scratch = tmp_path_factory.mktemp(f"reference-{name}")
    yaml = paddlex_reference.pipeline_file(scratch, _place(name, scratch / "models"), template=_file(name))
    inputs = _inputs(name)
    return name, inputs, paddlex_reference.reference_documents(yaml, [data for data, _ in inputs])


def _read(name: str, result: dict, held) -> bool:
    """Whether the pipeline's result holds what the input does."""
    if name == "tables":
        (table,) = result["table_res_list"]
        return all(f"<td>{text}</td>" in table["pred_html"] for row in held for text in row)
    if name == "seals":
        (seal,) = result["seal_res_list"]
        return seal["rec_texts"] == held
    (formula,) = result["formula_res_list"]
    return formula["rec_formula"] == held


@pytest.mark.timeout(1200)  # PaddleX's own runs are this test's set-up
def test_each_input_is_read_as_paddlex_reads_it(served, case):
    name, inputs, reference = case
    # Over v2 (inputs in flight together, their calls batched) and PaddleX serving's own endpoint.
    _, _, path, key = PIPELINES[name]
    answers = paddlex_reference.documents_as_paddlex(served, name, [data for data, _ in inputs], reference, path, key)
    # The stand-ins read them (PP-OCRv5 reads a seal's red O as Q at times, PaddleX as the service).
    read = sum(_read(name, answer, held) for answer, (_, held) in zip(answers, inputs))
    assert read >= (COUNT - 3 if name == "seals" else COUNT), f"{read} of {COUNT} {name} read"


def test_a_setting_reaches_paddlex_and_the_reading_can_fail(served):
    """The control: a recognition threshold of 1 for this request (PaddleX serving's ``textRecScoreThresh``,
    handed to PaddleX's predict as its serving hands it) drops every text PaddleX read, so the table's cells
    come back empty and the check that reads them fails."""
    data, held = _inputs("tables")[0]
    body = {"file": base64.b64encode(data).decode(), "fileType": 1}
    answers = [httpx.post(f"{served.url}/table-recognition", json={**body, **extra}, timeout=300)
               for extra in ({}, {"textRecScoreThresh": 1.0})]
    assert [a.status_code for a in answers] == [200, 200], answers[1].text[:500]
    kept, dropped = (a.json()["result"]["tableRecResults"][0]["prunedResult"] for a in answers)
    assert _read("tables", kept, held) and not _read("tables", dropped, held)
    assert dropped["table_res_list"][0]["pred_html"].count("<td></td>") == sum(len(row) for row in held)
