"""PaddleX's PP-StructureV3 pipeline, served from its file by the one mechanism with no code of its own (a
row of ``paddlex_pipeline.FIELDS``: its Markdown), against PaddleX itself.

The file is PaddleX's PP-StructureV3.yaml with seals on, over PaddleOCR's PP-OCRv5 mobile detector and
recogniser and stand-ins of the rest (tests/support/pp_structurev3_pipeline.yaml; standin_layout.py,
standin_tables.py, standin_formula.py). The pages are ``standin_layout.document``'s: a title, paragraphs,
a table (wired or not), a formula and a seal each. PaddleX's own pipeline on the same file and pages is the
reference: each page's result as PaddleX serving prunes it (its blocks, their boxes within 2 px, texts,
tables' HTML, formulas' LaTeX, seals' texts) and its Markdown, over v2 and over PaddleX serving's own
``/layout-parsing``, a PDF of them too. The controls: tables off for a request leaves the table's block
without its HTML, and the stand-ins are shown to read the pages (the table's cells, the seal's words).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import cv2
import httpx
import pytest
from support import ocr_models, paddlex_reference, standin_layout, standin_models, wait_until
from support.servers import ServiceProcess

PIPELINE = standin_models.STRUCTURE_PIPELINE
SEEDS = tuple(range(8))
LEAKS = "placeenv_device_leaks_total"


@pytest.fixture(scope="module")
def documents():
    return [standin_layout.document(seed) for seed in SEEDS]


@pytest.fixture(scope="module")
def images(documents):
    return [cv2.imencode(".png", page)[1].tobytes() for page, _ in documents]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return standin_models.place_structure(tmp_path_factory.mktemp("models"), pipeline=False)


@pytest.fixture(scope="module")
def reference_file(tmp_path_factory, models):
    return paddlex_reference.pipeline_file(tmp_path_factory.mktemp("reference"), models, template=PIPELINE)


@pytest.fixture(scope="module")
def reference(reference_file, images):
    return paddlex_reference.reference_documents(reference_file, images)


@pytest.fixture(scope="module")
def served(tmp_path_factory, models):
    root = tmp_path_factory.mktemp("repository")
    shutil.copytree(models, root / "documents")
    shutil.copyfile(PIPELINE, root / "documents" / "pipeline.yaml")
    with paddlex_reference.served(root, "documents") as proc:
        yield proc


def _over_v2(url: str, data: bytes, parameters: dict | None = None) -> tuple[dict, dict]:
    result = paddlex_reference.over_v2(url, "documents", data, parameters)
    return json.loads(result.as_numpy("result")[0]), json.loads(result.as_numpy("markdown")[0])


def _blocks(result: dict) -> list[tuple[str, str]]:
    return [(block["block_label"], block["block_content"]) for block in result["parsing_res_list"]]


def _markdown(markdown: dict) -> dict:
    """A Markdown answer as the reference keeps it: its text, its images' names, its flags."""
    return {"text": markdown["text"], "images": sorted(markdown.get("images") or {}),
            "flags": [markdown["isStart"], markdown["isEnd"]]}


@pytest.mark.timeout(1200)  # PaddleX's own run is this test's set-up
def test_the_pages_are_parsed_as_paddlex_parses_them(served, images, reference, documents):
    answers = paddlex_reference.together(served, _over_v2, images)  # pages in flight, their calls batched
    for seed, (result, markdown), expected in zip(SEEDS, answers, reference):
        assert paddlex_reference.near(result, expected["result"]) == [], f"page {seed}"
        assert _markdown(markdown) == expected["markdown"], f"page {seed}"
    # The stand-ins read the pages: each block PaddleX found is one drawn, the table's cells and the
    # formula's LaTeX are in its answer, and most seal words are (PP-OCRv5 reads a seal's red O as Q at
    # times, PaddleX as the service).
    words = read = 0
    for (page, blocks), (result, markdown) in zip(documents, answers):
        found = _blocks(result)
        assert sorted(label for label, _ in found) == sorted(label for label, _, _ in blocks)
        contents = {label: content for label, content in found}
        held = {label: content for label, _, content in blocks}
        assert all(f"<td>{text}</td>" in contents["table"] for row in held["table"] for text in row), contents["table"]
        assert contents["formula"] == held["formula"]
        words += len(held["seal"])
        read += sum(word in contents["seal"].split() for word in held["seal"])
        assert "<table" in markdown["text"] and f"$${held['formula']}$$" in markdown["text"]
    assert read >= 0.6 * words, f"{read} of {words} seal words read"


def test_paddlex_servings_own_request_gets_its_answer(served, images, reference):
    body = {"file": base64.b64encode(images[0]).decode(), "fileType": 1, "visualize": False}
    answer = httpx.post(f"{served.url}/layout-parsing", json=body, timeout=300)
    assert answer.status_code == 200, answer.text[:500]
    (page,) = answer.json()["result"]["layoutParsingResults"]
    assert paddlex_reference.near(page["prunedResult"], reference[0]["result"]) == []
    assert _markdown(page["markdown"]) == reference[0]["markdown"]
    height, width = cv2.imdecode(__import__("numpy").frombuffer(images[0], "uint8"), cv2.IMREAD_COLOR).shape[:2]
    assert answer.json()["result"]["dataInfo"] == {"width": width, "height": height, "type": "image"}
    # The control: tables off for this request leaves the table's block without its HTML (PaddleX's own
    # switch, handed to its predict as PaddleX serving hands it).
    off = httpx.post(f"{served.url}/layout-parsing", json={**body, "useTableRecognition": False}, timeout=300)
    assert off.status_code == 200, off.text[:500]
    (page,) = off.json()["result"]["layoutParsingResults"]
    assert "<table" not in dict(_blocks(page["prunedResult"])).get("table", "")
    assert page["prunedResult"]["model_settings"]["use_table_recognition"] is False


@pytest.mark.timeout(1200)
def test_a_pdf_is_parsed_a_page_at_a_time_as_paddlex_serving_reads_it(served, images, reference_file):
    from paddlex.inference.serving.infra.utils import read_pdf

    pdf = paddlex_reference.pdf_of(images[:3])
    rendered, info = read_pdf(pdf)  # PaddleX serving's own reading of the PDF, which the service uses
    pages = [cv2.imencode(".png", page)[1].tobytes() for page in rendered]
    expected = paddlex_reference.reference_documents(reference_file, pages)
    body = {"file": base64.b64encode(pdf).decode(), "fileType": 0}
    answer = httpx.post(f"{served.url}/layout-parsing", json=body, timeout=600)
    assert answer.status_code == 200, answer.text[:500]
    results = answer.json()["result"]["layoutParsingResults"]
    assert len(results) == 3
    for got, want in zip(results, expected):
        assert paddlex_reference.near(got["prunedResult"], want["result"]) == []
        assert _markdown(got["markdown"]) == want["markdown"]
    assert answer.json()["result"]["dataInfo"] == info.model_dump(mode="json")


def test_its_models_are_the_modules_paddlex_builds(served):
    names = {m["name"] for m in httpx.post(f"{served.url}/v2/repository/index", json={}, timeout=30).json()}
    assert names == {"documents", "documents.pipeline", "documents.LayoutDetection", "documents.RegionDetection",
                     "documents.GeneralOCR.TextDetection", "documents.TextRecognition", "documents.TableClassification",
                     "documents.WiredTableStructureRecognition", "documents.WirelessTableStructureRecognition",
                     "documents.WiredTableCellsDetection", "documents.WirelessTableCellsDetection",
                     "documents.TableOrientationClassify", "documents.SealRecognition.SealOCR.TextDetection",
                     "documents.FormulaRecognition"}
    outputs = httpx.get(f"{served.url}/v2/models/documents", timeout=30).json()["outputs"]
    assert [o["name"] for o in outputs] == ["result", "markdown"]


def _locust(url: str, csv, seconds: int = 10, finish: int = 300, until=None):
    """Locust's load test (loadtest/, which drives POST /ocr with real pages, as images and PDFs, when a
    PaddleX OCR pipeline is served, and POST /layout-parsing with PDFs of document pages when a PP-StructureV3
    one is, checking each answer against what was drawn) and its leak gate; its exit code and output. Its 3
    users start on the 3 tasks, one each, and the requests in flight at ``seconds`` get up to ``finish`` seconds
    more to be answered, so every task is counted however slow the machine (a request's own timeout is 300 s,
so that a slow answer is the service's 504, not the client giving up). ``until``: a check that ends the
    run as soon as it holds (SIGTERM, which Locust answers with its gate), before ``seconds``."""
    root = Path(__file__).resolve().parents[2]
    run = subprocess.Popen(
        [str(Path(sys.executable).with_name("locust")), "-f", "loadtest/", "--host", url, "-u", "3", "-r", "3",
         "-t", f"{seconds}s", "--stop-timeout", str(finish), "--network-timeout", "300",
         "--max-failure-ratio", "0", "--csv", str(csv), "--html", f"{csv}.html"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if until is not None:
            wait_until(lambda: until() or run.poll() is not None, timeout=seconds, message="the check never held",
                       interval=1.0)
            run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=seconds + finish + 180)
    finally:
        run.kill()
    return run.returncode, output


@pytest.fixture(scope="module")
def both(tmp_path_factory, models):
    """A repository of PaddleX's OCR file (``ocr``) and this PP-StructureV3 one (``documents``)."""
    root = tmp_path_factory.mktemp("both")
    shutil.copytree(models, root / "documents")
    shutil.copyfile(PIPELINE, root / "documents" / "pipeline.yaml")
    (root / "ocr").mkdir()
    for kind in ("det", "rec"):
        shutil.copytree(ocr_models.models()[kind], root / "ocr" / ocr_models.NAMES[kind])
    shutil.copyfile(paddlex_reference.PIPELINE, root / "ocr" / "pipeline.yaml")
    return root


@pytest.mark.timeout(900)
@pytest.mark.parametrize("isolation", ["on", "off"])
def test_locust_through_paddlex_servings_api_has_no_leak_and_reads_every_page(both, tmp_path, isolation):
    """Locust's users post real pages to /ocr (images and PDFs) and PDFs of document pages to /layout-parsing
    on two devices, sim:0 and sim:1 (the exports there, the pipelines on CPU workers of their own: where the
    CPU is a device too, its one worker a device would run them all, a page of PP-StructureV3 seconds): with
    isolation every answer reads as drawn and the leak gate passes; the control, stock Paddle (isolation off),
    makes the place checks see other workers' devices and fails it. The control serves the OCR file alone on
    sim:0 (its Locust users post to /ocr only: the same gate, through the same API, without a start of some 30
    models; the pipeline's CPU workers move the one device under the device's worker), its run ends at its first
    leak (what it shows is that the gate fires; its requests are cut short) and its service is killed."""
    # A PP-StructureV3 PDF beside three other requests on a loaded 2-core machine takes over the default 60 s.
    proc = ServiceProcess(devices="sim:0,sim:1" if isolation == "on" else "sim:0", workers_per_device=1,
                          model_repository=both, models="ocr,documents" if isolation == "on" else "ocr",
                          isolation=isolation, request_timeout_s=240)
    try:
        proc.wait_ready(600)  # (some 30 models: on a busy 2-core machine, minutes)
        before = proc.total(LEAKS)  # (without isolation, the models' warm-up may have leaked already)
        if isolation == "on":
            code, output = _locust(proc.url, tmp_path / "run")
        else:
            code, output = _locust(proc.url, tmp_path / "run", seconds=300, finish=0,
                                   until=lambda: proc.total(LEAKS) > before)
        leaks = proc.total(LEAKS) - before
    finally:
        proc.stop() if isolation == "on" else proc.kill()
    found = re.search(r"requests (\d+), failures (\d+)", output)
    assert found, output[-3000:]
    requests, failures = int(found.group(1)), int(found.group(2))
    if isolation == "on":
        # The tasks ran: a PDF through /layout-parsing, and /ocr (an image and a PDF: each user's first task is
        # the next in turn, then they pick at random).
        assert all(name in output for name in ("/layout-parsing, a PDF", "/ocr (PaddleX", "/ocr, a 2-page PDF")), \
            output[-3000:]
        assert code == 0 and "leak gate: PASS" in output and failures == 0 and leaks == 0, output[-3000:]
        assert requests >= 3, output[-3000:]
    else:
        assert code != 0 and "leak gate: FAIL" in output and leaks > 0, output[-3000:]
