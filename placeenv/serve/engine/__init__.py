"""The engine room: models, devices, queues and workers (imports Paddle).

    engine.py      ``Engine``: the facade the service holds (``submit``, start and stop, the catalog,
                   statistics, load and unload), and ``running``, how the service runs it
    generation.py  what is served, as one immutable ``Generation`` swapped whole; the requests admitted
                   under it, counted
    path.py        the request path: a request admitted, preprocessed, queued and answered once
                   (``RequestPath``, ``Completion``)
    pipeline.py    a request through a pipeline's steps, and a model's call to another (``Model.infer``)
    control.py     model control: a load or an unload builds the next generation, swaps it, retires the old
    job.py         a job: one request's work on one model, answered once; what a batch joins it by
    dispatch.py    per-device bounded queues, batching, and the ``Dispatcher`` that admits a job
    stats.py       each served version's statistics (Triton's), a request's timings
    worker.py      a worker thread, pinned to one device: a loop that takes a batch, runs it and answers
    replica.py     a worker's replicas (``Replicas``): built, shared weights, warmed up, installed, finalized
    batch.py       the failure policy (``run_batch``: one answer per job), and the place checks
    calls.py       a worker's batches in hand, and its models' calls to others (``Model.infer``)
    forward.py     the one ``forward`` pass over a batch, and what it joins (step tensors, padding, parts)
    workers.py     the worker pool: every worker, and the thread that replaces a dead one
    local.py       the engine in this process, as a gateway's ``EngineHandle``
    standalone.py  a repository model run without the service, as a worker runs it

It imports the protocol room (protocol/) and the model contract (models/), never a protocol's
adapter (http/, grpc.py) nor a process (process/).
"""
