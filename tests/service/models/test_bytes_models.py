"""A model that takes BYTES needs a preprocess of its own: the repository says so at start."""

from __future__ import annotations

from pathlib import Path

from support.servers import TEST_REPOSITORY

from placeenv.serve.models import scan

WITHOUT_PREPROCESS = '''
import paddle
from placeenv.serve.models import Model as Base, TensorSpec

class Model(Base):
    inputs = (TensorSpec("text", "BYTES", (-1,)),)
    outputs = (TensorSpec("n", "INT64", (-1,)),)

    def load(self, context):
        return paddle.nn.Identity()
'''


def test_a_bytes_input_without_a_preprocess_is_refused_naming_it(tmp_path: Path):
    (tmp_path / "raw" / "1").mkdir(parents=True)
    (tmp_path / "raw" / "1" / "model.py").write_text(WITHOUT_PREPROCESS)
    entries, errors = scan([tmp_path], None, max_batch_size=8, max_batch_delay_ms=0)
    assert entries == {} and len(errors) == 1
    assert "BYTES inputs ['text'] need a preprocess of the model's own" in str(errors[0])


def test_the_control_a_bytes_model_with_its_preprocess_is_served():
    entries, errors = scan([Path(TEST_REPOSITORY)], ["text"], max_batch_size=8, max_batch_delay_ms=0)
    assert errors == [] and [s.datatype for s in entries["text"].default.context.inputs] == ["BYTES"]
