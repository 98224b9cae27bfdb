"""The PaddleX reference's kept answers (tests/support/paddlex_reference.py, ``_kept``): PaddleX runs again
for any change of its inputs (an image, a pipeline file's export, the venv), and only then."""

from __future__ import annotations

import re

import pytest
from loadtest import pages
from support import paddlex_reference


@pytest.fixture
def venv(tmp_path, monkeypatch):
    """A made venv of its own (its marker), so that nothing here touches the real one's answers."""
    monkeypatch.setattr(paddlex_reference, "venv_dir", lambda: tmp_path)
    (tmp_path / paddlex_reference.MARKER).write_text('{"paddlex": "3.7.2"}\n')
    return tmp_path


def test_an_answer_is_kept_by_every_input_of_its_run(venv, tmp_path):
    runs = []

    def compute():
        runs.append(1)
        return [{"rec_texts": [f"run {len(runs)}"]}]

    model = tmp_path / "model"
    model.mkdir()
    (model / "inference.json").write_text("{}")
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"SubModules:\n  TextDetection:\n    model_dir: {model}\n")

    def asked(image: bytes):
        return paddlex_reference._kept([paddlex_reference._pipeline_text(pipeline), image], compute)

    assert asked(b"page") == asked(b"page") == [{"rec_texts": ["run 1"]}] and len(runs) == 1
    assert asked(b"other page") == [{"rec_texts": ["run 2"]}]
    (model / "inference.json").write_text('{"changed": 1}')  # an export's file
    assert asked(b"page") == [{"rec_texts": ["run 3"]}]
    moved = tmp_path / "moved"
    model.rename(moved)  # the same files elsewhere: the same answer
    pipeline.write_text(f"SubModules:\n  TextDetection:\n    model_dir: {moved}\n")
    assert asked(b"page") == [{"rec_texts": ["run 3"]}]
    (venv / paddlex_reference.MARKER).write_text('{"paddlex": "3.7.2", "made": "again"}\n')
    assert asked(b"page") == [{"rec_texts": ["run 4"]}] and len(runs) == 4


def test_a_pdf_is_kept_by_its_pages_not_by_when_and_as_which_file_it_was_saved():
    """PDFium gives each saved file a new random ``/ID`` and the time it was saved: two PDFs of one page differ in
    these alone, and key alike; a PDF of another page keys apart (the control)."""
    first, again = (paddlex_reference.pdf_of([pages.page(0).data]) for _ in range(2))
    saved_before = re.sub(rb"/CreationDate\(D:\d{14}", b"/CreationDate(D:19990101000000", first)
    assert saved_before != first
    assert paddlex_reference.pdf_content(saved_before) == paddlex_reference.pdf_content(first)
    other = paddlex_reference.pdf_of([pages.page(1).data])
    assert first != again and len(first) == len(again)
    assert paddlex_reference.pdf_content(first) == paddlex_reference.pdf_content(again)
    assert paddlex_reference.pdf_content(first) != paddlex_reference.pdf_content(other)
