"""The engine room: models, devices, queues and workers (imports Paddle).

    engine.py      ``Engine``: the one way in (``submit``), preprocessing, statistics, start and stop
    dispatch.py    jobs, per-device bounded queues, batching, and the ``Dispatcher`` that admits them
    workers.py     worker threads, each pinned to one device; the one ``forward`` pass
    local.py       the engine in this process, as a gateway's ``EngineHandle``
    standalone.py  a repository model run without the service, as a worker runs it

It imports the protocol room (protocol/) and the model contract (models/), never a protocol's
adapter (http/, grpc.py) nor a process (process/).
"""
