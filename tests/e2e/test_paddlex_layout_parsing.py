"""PaddleX's first-generation document pipelines, layout_parsing and table_recognition, each served from its
file by the one mechanism with no code of its own, against PaddleX itself.

The files are PaddleX's own (tests/support/layout_parsing_pipeline.yaml, table_recognition_pipeline.yaml)
over PaddleOCR's PP-OCRv5 mobile exports and stand-ins of the rest: layout_parsing's RT-DETR-H_layout_17cls
(standin_layout.py), SLANet_plus (standin_tables.py) and the seal detector (standin_formula.py). The inputs
are standin_layout's document pages (a title, paragraphs, a table, a formula and a seal each) and
standin_tables' tables, 8 of each; one service serves both pipelines, so each has PaddleX serving's
endpoint to itself (``/layout-parsing``, ``/table-recognition``). PaddleX's own pipeline on the same files
and inputs is the reference: each result as PaddleX serving prunes it, over v2 (inputs in flight together,
their network calls batched), over PaddleX serving's endpoint, and a 2-page PDF through it. The stand-ins are
shown to read the inputs (a page's blocks and its table's cells and seal's words, a table's cells); the
control, tables off for one request, leaves a page's table block without its HTML.
"""

from __future__ import annotations

import base64

import cv2
import httpx
import pytest
from support import paddlex_reference, standin_layout, standin_models, standin_tables

COUNT = 8
#: Each pipeline: its repository name -> its file, the stand-ins it names, its endpoint, its result list's key.
PIPELINES = {
    "layout": ("layout_parsing", (standin_layout.LAYOUT_17, standin_tables.WIRELESS_STRUCTURE,
                                  "PP-OCRv4_server_seal_det"), "/layout-parsing", "layoutParsingResults"),
    "tables": ("table_recognition", (standin_tables.WIRELESS_STRUCTURE,), "/table-recognition", "tableRecResults"),
}


def _inputs(name: str) -> list[tuple[bytes, object]]:
    """Each input (PNG) and what it holds: a page's blocks (label, box, content), a table's cells."""
    made = []
    for seed in range(COUNT):
        if name == "layout":
            image, held = standin_layout.document(seed)
        else:
            image, held = standin_tables.table(seed, 360 + 70 * seed, 200 + 20 * seed, wired=seed % 2 == 0)
        made.append((cv2.imencode(".png", image)[1].tobytes(), held))
    return made


def _file(name: str):
    return paddlex_reference.PIPELINE.with_name(f"{PIPELINES[name][0]}_pipeline.yaml")


def _place(name: str, directory):
    return standin_models.place(directory, PIPELINES[name][1])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with paddlex_reference.served_files(tmp_path_factory.mktemp("repository"),
                                        {name: _file(name) for name in PIPELINES}, _place) as proc:
        yield proc


@pytest.fixture(scope="module")
def reference_files(tmp_path_factory):
    files = {}
    for name in PIPELINES:
        scratch = tmp_path_factory.mktemp(f"reference-{name}")
        files[name] = paddlex_reference.pipeline_file(scratch, _place(name, scratch / "models"), template=_file(name))
    return files


@pytest.fixture(scope="module", params=list(PIPELINES))
def case(request, reference_files):
    """A pipeline's name, inputs and PaddleX's answers to them."""
    inputs = _inputs(request.param)
    return request.param, inputs, paddlex_reference.reference_documents(reference_files[request.param],
                                                                        [data for data, _ in inputs])


def _blocks(result: dict) -> dict[str, str]:
    return {block["block_label"]: block["block_content"] for block in result["parsing_res_list"]}


def _held(held) -> dict:
    """A page's drawn blocks: label -> content (the one table's cells, the seal's words)."""
    return {label: content for label, _, content in held}


def _read(name: str, result: dict, held) -> bool:
    """Whether the pipeline's result holds what the input does: a table's cells; a page's drawn blocks and its
    table's cells, the table block's content the table's HTML."""
    cells = held if name == "tables" else _held(held)["table"]
    html = result["table_res_list"][0]["pred_html"]
    if not all(f"<td>{text}</td>" in html for row in cells for text in row):
        return False
    return name == "tables" or ({label for label, _, _ in held} <= set(_blocks(result))
                                and _blocks(result)["table"] == html)


@pytest.mark.timeout(1200)  # PaddleX's own runs are this test's set-up
def test_each_input_is_read_as_paddlex_reads_it(served, case):
    name, inputs, reference = case
    # Over v2 (inputs in flight together, their calls batched) and PaddleX serving's own endpoint.
    _, _, path, key = PIPELINES[name]
    answers = paddlex_reference.documents_as_paddlex(served, name, [data for data, _ in inputs], reference, path, key)
    read = sum(_read(name, answer, held) for answer, (_, held) in zip(answers, inputs))
    assert read == COUNT, f"{read} of {COUNT} {name} read"
    if name == "layout":  # most seal words (PP-OCRv5 reads a seal's red O as Q at times, PaddleX as the service)
        words = [(word, _blocks(answer)["seal"]) for answer, (_, held) in zip(answers, inputs)
                 for word in _held(held)["seal"]]
        assert sum(word in found.split(", ") for word, found in words) >= 0.6 * len(words), words


@pytest.mark.timeout(1200)
def test_a_pdf_is_parsed_a_page_at_a_time_and_tables_can_be_turned_off(served, reference_files):
    from paddlex.inference.serving.infra.utils import read_pdf

    pdf = paddlex_reference.pdf_of([data for data, _ in _inputs("layout")[:2]])
    rendered, info = read_pdf(pdf)  # PaddleX serving's own reading of the PDF, which the service uses
    expected = paddlex_reference.reference_documents(reference_files["layout"],
                                                     [cv2.imencode(".png", page)[1].tobytes() for page in rendered])
    body = {"file": base64.b64encode(pdf).decode(), "fileType": 0}
    answer = httpx.post(f"{served.url}/layout-parsing", json=body, timeout=600)
    assert answer.status_code == 200, answer.text[:500]
    results = answer.json()["result"]["layoutParsingResults"]
    assert [paddlex_reference.near(got["prunedResult"], want["result"]) for got, want in zip(results, expected)] \
        == [[], []]
    assert answer.json()["result"]["dataInfo"] == info.model_dump(mode="json")
    # The control: tables off for this request (PaddleX's own switch, handed to its predict as PaddleX serving
    # hands it) leaves the table's block without its HTML.
    off = httpx.post(f"{served.url}/layout-parsing", json={**body, "useTableRecognition": False}, timeout=600)
    assert off.status_code == 200, off.text[:500]
    for got in off.json()["result"]["layoutParsingResults"]:
        assert "<table" not in _blocks(got["prunedResult"])["table"]
        assert got["prunedResult"]["model_settings"]["use_table_recognition"] is False
