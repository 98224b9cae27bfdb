"""PaddleX's YAML reader in the service (models/paddlex_yaml.py): PaddleX reads an export's
``inference.yml`` for each predictor it builds, a recogniser's with its 18,000-line character dictionary.
Once PaddleX's engine is registered, a file is parsed once while it is unchanged (libyaml's parser under
PaddleX's own FullLoader constructor), each read gets the mapping PaddleX's own reader gives, as a copy of
its own; a changed file is parsed again (the control: the count of parses grows)."""

from __future__ import annotations

import shutil

import yaml
from support import ocr_models

from placeenv.serve.models import paddlex_pipeline


def test_an_exports_file_is_parsed_once_and_each_read_is_paddlexs_mapping_as_a_copy(tmp_path, monkeypatch):
    from paddlex.inference.models.utils.model_config import load_model_config

    paddlex_pipeline.register(set())
    shutil.copytree(ocr_models.models()["rec"], tmp_path / "rec")
    path = tmp_path / "rec" / "inference.yml"
    with open(path, encoding="utf-8") as file:
        expected = yaml.load(file, Loader=yaml.FullLoader)  # PaddleX's own reading
    parses = []
    load = yaml.load
    monkeypatch.setattr(yaml, "load", lambda *args, **kwargs: parses.append(1) or load(*args, **kwargs))

    first = load_model_config(tmp_path / "rec")
    assert first == expected and len(expected["PostProcess"]["character_dict"]) > 10_000
    first["PostProcess"]["character_dict"].clear()  # PaddleX may change what it read: the next read is whole
    assert load_model_config(tmp_path / "rec") == expected
    assert len(parses) == 1

    # The control: the file changed, so it is parsed again and read as it is now.
    path.write_text(path.read_text(encoding="utf-8").replace("model_name: ", "model_name: x", 1), encoding="utf-8")
    changed = load_model_config(tmp_path / "rec")
    assert len(parses) == 2 and changed["Global"]["model_name"] == "x" + expected["Global"]["model_name"]
