"""The bundled repository as the service reads it at start, and a request's examples checked the
service's way, for tests that check models without serving them.

    from support.bundled import ENTRIES, checked, template

Importing it builds the programs built at start (mobilenet's, the OCR pipeline's) if they are not
there, as the service does.
"""

from __future__ import annotations

import numpy as np

from placeenv.serve.models import BUNDLED, Model, scan
from placeenv.serve.models import examples as bundled
from placeenv.serve.protocol import wire

for _name in bundled.BUILT_AT_START:  # what the service does at start: these are built, not committed
    bundled.ensure(_name)
ENTRIES, ERRORS = scan([BUNDLED], None, max_batch_size=8, max_batch_delay_ms=2.0)


def template(name: str) -> Model:
    """A CPU-side instance for preprocessing, as the service keeps one: a context, no network."""
    entry = ENTRIES[name]
    model = entry.default.model_class()
    model.context = entry.default.context
    return model


def checked(name: str, examples, spec: int = 0) -> np.ndarray:
    """A request's examples for input ``spec`` of ``name``, checked the service's way; raises the 400s."""
    model = template(name)
    tensor = model.context.inputs[spec]
    array = wire.from_json(examples, tensor.datatype, tensor.name)
    tensor.check(array)
    return model.preprocess({tensor.name: array})[tensor.name]
