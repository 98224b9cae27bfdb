"""Holds a worker for a test: each request's value is a TCP port on 127.0.0.1 where the test listens;
execute connects there and blocks until the test sends a byte (or closes), then answers the value.

A test sends one such request per worker to occupy them all (it knows they are held when it has
accepted that many connections), queues the requests it wants batched, then releases the workers:
each finds its queue already full and takes whole batches, whatever the machine's speed.
"""

import socket

import paddle

from placeenv.serve.models import Model as Base, TensorSpec

#: The longest a request holds its worker when the test never releases it (a failed test).
HOLD_S = 120


class Model(Base):
    inputs = [TensorSpec("port", "FP32", (-1, 1))]
    outputs = [TensorSpec("port", "FP32", (-1, 1))]

    def load(self, context):
        layer = paddle.nn.Linear(1, 1, bias_attr=False)
        layer.weight.set_value(paddle.ones([1, 1]))
        return layer

    def execute(self, inputs):
        for port in inputs["port"].numpy()[:, 0]:
            with socket.create_connection(("127.0.0.1", int(port)), timeout=HOLD_S) as held:
                held.recv(1)  # the test's release: a byte, or its end of the connection closing
        return super().execute(inputs)
