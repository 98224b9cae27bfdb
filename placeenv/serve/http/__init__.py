"""The HTTP room: the FastAPI app, over one ``Gateway`` (protocol/gateway.py).

    app.py          the app: operational endpoints, error handlers, start-up
    routes.py       the inference route table, its one router (``InferRouter``) and its documentation
    predict.py      ``POST /predict``, the simple JSON API
    v2.py           the Open Inference Protocol over REST (KServe v2, Triton's binary extension)
    responses.py    the one JSON renderer, and the answer to a ``ServiceError``
    middleware.py   plain ASGI pieces: the body limit, a quiet start-up failure
    pages.py        what a person reads: ``GET /``'s index, the documentation pages

It imports the protocol room, never the engine (engine/) nor a process (process/).
"""
