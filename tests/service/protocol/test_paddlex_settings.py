"""A PaddleX pipeline's per-request settings (protocol/paddlex.py): each setting's kind read from the
annotation of PaddleX's ``predict``, a request's value checked against it (a wrong one named, with what to
send), a mapping sent as its JSON text, and the bounds that keep a request from sizing an image without end."""

from __future__ import annotations

import pytest

from placeenv.serve.protocol.errors import InvalidInput
from placeenv.serve.protocol.paddlex import kind_of, settings


@pytest.mark.parametrize("annotation, kind", [
    ("Optional[bool]", "bool"), ("Union[int, NoneType]", "int"), ("Optional[float]", "number"),
    ("Union[float, int, None]", "number"), ("Optional[str]", "str"), ("Union[float, dict, NoneType]", "json"),
    ("Optional[list]", "json"), ("Union[str, dict, NoneType]", "text"), ("", "text"),
])
def test_a_settings_kind_is_read_from_its_annotation(annotation, kind):
    assert kind_of(annotation) == kind


TABLE = {"use_textline_orientation": "bool", "text_det_limit_side_len": "int", "text_det_thresh": "number",
         "text_det_limit_type": "str", "threshold": "json"}


def test_values_of_their_kind_pass_and_json_text_becomes_paddlexs_mapping():
    given = {"use_textline_orientation": True, "text_det_limit_side_len": 960, "text_det_thresh": 1,
             "text_det_limit_type": "max", "threshold": '{"0": 0.5, "2": 0.7}'}
    assert settings(TABLE, given) == {**given, "threshold": {0: 0.5, 2: 0.7}}
    assert settings(TABLE, {"threshold": 0.4}) == {"threshold": 0.4}
    assert settings(TABLE, {}) == {}


@pytest.mark.parametrize("given, says", [
    ({"use_textline_orientation": 1}, "parameter use_textline_orientation 1: send true or false"),
    ({"text_det_limit_side_len": 9.5}, "send a whole number"),
    ({"text_det_limit_side_len": 10 ** 6}, "send a whole number from 0 to 100000"),
    ({"text_det_thresh": "high"}, "send a number"),
    ({"text_det_limit_type": "wide"}, "send one of min, max, resize_long"),
    ({"threshold": "{not json"}, "not JSON"),
    ({"threshold": "all"}, "parameter threshold 'all': send a number, or a JSON object or list as text"),
    ({"no_such": 1}, "'no_such': not a setting of this PaddleX pipeline; it takes text_det_limit_side_len"),
])
def test_a_wrong_setting_is_refused_naming_it(given, says):
    with pytest.raises(InvalidInput) as refused:
        settings(TABLE, given)
    assert says in str(refused.value), str(refused.value)
