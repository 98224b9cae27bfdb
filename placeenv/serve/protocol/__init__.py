"""The protocol room: what every protocol shares, no Paddle, no HTTP.

    request.py   ``InferRequest``, ``Work``, ``Result`` and the ``Catalog`` a request is checked against
    wire.py      tensors on the wire: JSON number lists and binary buffers to numpy arrays, and back
    errors.py    the service's errors and ``OUTCOMES``, the one table of what each means on the wire
    gateway.py   ``Gateway``: the one layer every adapter hands its requests to

It imports only the service's settings and metrics (config.py, metrics.py).
"""
