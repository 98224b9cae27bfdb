"""The process room: how the service runs, in one process or several (imports every other room).

    cli.py            ``python -m placeenv.serve``: settings, ports, and the single process
    server.py         uvicorn with the shutdown a load balancer needs; the gRPC listener beside it
    supervisor.py     ``--frontends K``: starts and watches the engine process and K front ends
    engine_main.py    the engine process's main: the ``Engine``, answering front ends over the link
    frontend_main.py  a front end's main: HTTP and gRPC, its gateway's engine across the link
    link.py           the link between front ends and the engine: ZeroMQ over ipc
    runtime.py        what the supervisor shares with its children: the run directory
"""
