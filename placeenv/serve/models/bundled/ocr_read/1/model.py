"""The OCR pipeline's last step, on the CPU: finds the lines of each page from the detector's row ink,
cuts them out (a number that depends on the page), and reads them all with one call to ``ocr_rec``
(``Model.infer``, Triton's BLS): the lines of a batch's pages share that model's forward pass."""

import numpy as np

from placeenv.serve.models import Model as Base
from placeenv.serve.models import TensorSpec
from placeenv.serve.models.examples import PAGE, line_crops, read_lines, text_lines


class Model(Base):
    inputs = (TensorSpec("image", "FP32", (-1, 1, *PAGE)), TensorSpec("rows", "FP32", (-1, PAGE[0])))
    outputs = (TensorSpec("text", "BYTES", (-1,)), TensorSpec("lines", "INT64", (-1,)))

    def load(self, context):
        return None

    def execute(self, inputs):
        pages, rows = inputs["image"].numpy(), inputs["rows"].numpy()
        found = [text_lines(r) for r in rows]
        crops = [line_crops(page, lines) for page, lines in zip(pages, found)]
        read = iter([])
        if any(len(c) for c in crops):
            logits = self.infer("ocr_rec", {"crop": np.concatenate(crops)})["fetch_name_0"]
            read = iter(read_lines(logits))
        text = np.array(["\n".join(next(read) for _ in lines).encode() for lines in found], dtype=object)
        return {"text": text, "lines": np.array([len(lines) for lines in found], dtype=np.int64)}
