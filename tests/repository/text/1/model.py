"""BYTES in and out, with a forward on the device: each text becomes a row of 64 byte codes on the
CPU (preprocess), the device upper-cases the ASCII letters and counts the bytes (execute), and the
rows become bytes again (postprocess)."""

import numpy as np
import paddle

from placeenv.serve.models import InputError, TensorSpec
from placeenv.serve.models import Model as Base

WIDTH = 64


class Upper(paddle.nn.Layer):
    def forward(self, codes):
        lower = paddle.logical_and(codes >= 97, codes <= 122).astype(codes.dtype)
        return codes - 32 * lower, (codes > 0).astype("int64").sum(axis=1)


class Model(Base):
    inputs = (TensorSpec("text", "BYTES", (-1,)),)
    outputs = (TensorSpec("upper", "BYTES", (-1,)), TensorSpec("length", "INT64", (-1,)))

    def load(self, context):
        return Upper()

    def preprocess(self, inputs):
        texts = inputs["text"]
        codes = np.zeros((len(texts), WIDTH), dtype=np.int64)
        for i, text in enumerate(texts):
            if len(text) > WIDTH or b"\0" in text:
                raise InputError(f"input 'text' element {i}: at most {WIDTH} bytes, none of them 0")
            codes[i, :len(text)] = np.frombuffer(text, dtype=np.uint8)
        return {"text": codes}

    def execute(self, inputs):
        with self._env, paddle.no_grad():
            upper, length = self.network(inputs["text"])
        return {"upper": upper, "length": length}

    def postprocess(self, outputs):
        codes, length = outputs["upper"].numpy(), outputs["length"].numpy()
        upper = np.empty(len(codes), dtype=object)
        for i, (row, n) in enumerate(zip(codes, length)):
            upper[i] = row[:n].astype(np.uint8).tobytes()
        return {"upper": upper, "length": length}
