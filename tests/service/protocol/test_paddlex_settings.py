"""A PaddleX OCR request's document-preprocessor switches (protocol/paddlex.py), as PaddleX's OCR pipeline
sets them from ``pipeline.predict``'s arguments and the file's, and each refusal naming the switch."""

from __future__ import annotations

import pytest

from placeenv.serve.protocol.errors import InvalidInput
from placeenv.serve.protocol.paddlex import doc_preprocessing

BOTH = {"use_doc_orientation_classify": True, "use_doc_unwarping": True}
ORIENTATION_ONLY = {"use_doc_orientation_classify": True, "use_doc_unwarping": False}


@pytest.mark.parametrize("doc, sent, runs", [
    (BOTH, {}, BOTH),  # nothing sent: the file's
    (None, {}, None),
    (BOTH, {"use_doc_unwarping": False}, None),  # PaddleX's: no switch sent true turns it all off
    (BOTH, {"use_doc_orientation_classify": True, "use_doc_unwarping": False}, ORIENTATION_ONLY),
    (BOTH, {"use_doc_orientation_classify": True}, BOTH),  # the other left out: the file's
    (ORIENTATION_ONLY, {"use_doc_orientation_classify": True}, ORIENTATION_ONLY),
    (BOTH, {"use_doc_orientation_classify": False, "use_doc_unwarping": False}, None),
    (None, {"use_doc_orientation_classify": False}, None),  # off where there is none: not refused
])
def test_a_requests_switches_meet_the_files_as_in_paddlex(doc, sent, runs):
    assert doc_preprocessing(doc, sent) == runs


@pytest.mark.parametrize("doc, sent, says", [
    (None, {"use_doc_unwarping": True}, "parameter use_doc_unwarping true: this pipeline's file has no document "
                                        "preprocessor"),
    (ORIENTATION_ONLY, {"use_doc_unwarping": True}, "turns use_doc_unwarping off"),
])
def test_a_module_the_pipeline_has_no_model_for_is_refused_naming_it(doc, sent, says):
    with pytest.raises(InvalidInput) as refused:
        doc_preprocessing(doc, sent)
    assert says in str(refused.value) and "send false or leave it out" in str(refused.value)
