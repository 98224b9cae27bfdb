"""The link's own cost (``--frontends`` K >= 1): a front end's ``EngineClient`` and an ``EngineServer``
over ipc, with a stub service whose ``run`` answers at once, so only the hop is timed.

    python benchmarks/hop.py [--rounds 5] [--requests 20000] [--concurrency 16] [--against REV]

Each variant runs in fresh interpreters (a client process that starts its engine process):

- ``local``: the K=0 hop, ``await service.run(work, arrays)`` in the same process (a function call);
- ``link``: the link (``placeenv/serve/process/link.py``) as it is in this checkout;
- ``link@REV`` (``--against REV``): the link as it was at git revision REV: the package of a git
  worktree at REV, put first on the clients' and engines' ``PYTHONPATH``.

A request is a digits request (one row of 64 float32, one output of 10 float32). Per variant: the
median round trip of sequential requests (c=1), then the throughput with ``--concurrency`` requests
in flight, and the CPU each process spent per request at that load. Rounds rotate the variants'
order; the table gives each figure's median over the rounds, with the lowest and highest round.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TICK = os.sysconf("SC_CLK_TCK")
SETTINGS = SimpleNamespace(queue_capacity=1 << 20, workers_per_device=1, max_batch_size=1, request_timeout_s=30.0)


def load_link():
    """The link module of the ``placeenv`` on the path: ``placeenv.serve.process.link``, or where an
    older tree keeps it, ``placeenv.serve.link``."""
    try:
        return importlib.import_module("placeenv.serve.process.link")
    except ModuleNotFoundError:
        return importlib.import_module("placeenv.serve.link")


def engine_client(link, endpoint: str):
    """``EngineClient`` as the loaded tree builds it (an older one takes the settings too)."""
    takes = inspect.signature(link.EngineClient).parameters
    return link.EngineClient(endpoint, SETTINGS) if "settings" in takes else link.EngineClient(endpoint)


class StubEngine:
    """What the engine's side of the link asks of the engine, answering every request at once."""

    def __init__(self) -> None:
        Catalog, Result = request_types("Catalog", "Result")

        self.Result = Result
        self.outputs = {"probabilities": np.full((1, 10), 0.1, np.float32)}
        self.received = self.answered = 0
        # As many requests in flight as the front end sends: the link refuses past the catalog's capacity.
        extra = {"capacity": 1 << 20} if "capacity" in Catalog.__struct_fields__ else {}
        self.catalog_value = Catalog({}, {}, ["sim:0"], 32, **extra)
        self.publishers: list = []  # who hears of a new catalog: the link's engine side adds itself

    def catalog(self):
        return self.catalog_value

    def status(self) -> dict:
        return {"ready": True, "stopping": False, "workers": {}}

    def statistics(self, model=None, version=None) -> list:
        return []

    def answer(self, work, arrays):
        return self.Result(work.model, work.version, self.outputs, {"probabilities": "FP32"}, "sim:0", "sim:0/0", 1,
                           True, {"preprocess_ms": 0.0, "queue_ms": 0.0, "compute_ms": 0.0, "total_ms": 0.0})

    async def run(self, work, arrays):
        """The K=0 hop: a call and a future, as ``LocalEngine.run`` makes it over ``submit``."""
        future = asyncio.get_running_loop().create_future()
        self.submit(work, arrays, lambda result, error: future.set_result(result))
        return await future

    def submit(self, work, arrays, done) -> None:
        """The engine's one way in: ``done(result, error)``."""
        done(self.answer(work, arrays), None)


def request_types(*names: str):
    """Classes of the request module of the ``placeenv`` on the path (an older tree keeps it elsewhere)."""
    try:
        module = importlib.import_module("placeenv.serve.protocol.request")
    except ModuleNotFoundError:
        module = importlib.import_module("placeenv.serve.request")
    return [getattr(module, name) for name in names]


def engine_main(endpoint: str, switch_ms: float) -> None:
    sys.setswitchinterval(switch_ms / 1000)
    link = load_link()

    async def serve() -> None:
        # The engine's side: link_server.py, or in link.py where an older tree keeps it.
        serving = link if hasattr(link, "EngineServer") else importlib.import_module(
            link.__name__.rsplit(".", 1)[0] + ".link_server")
        server = serving.EngineServer(StubEngine(), endpoint)
        if hasattr(server, "bind"):  # the engine binds before it serves (engine_main.py)
            server.bind()
        await server.serve()

    asyncio.run(serve())


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def request():
    (Work,) = request_types("Work")
    row = np.arange(64, dtype=np.float32).reshape(1, 64)
    if "deadline" in Work.__struct_fields__:
        def make():
            now = time.perf_counter()
            return Work("digits", 1, 1, ["probabilities"], now, now + 30.0, True), {"inputs": row}
        return make
    return lambda: (Work("digits", 1, 1, ["probabilities"], time.perf_counter(), True), {"inputs": row})


async def measure(run, requests: int, concurrency: int, engine_pid: int | None) -> dict:
    make = request()
    for _ in range(500):  # warm: the sockets' buffers, the allocator, the code paths
        await run(*make())
    sequential = []
    for _ in range(max(1000, requests // 4)):
        started = time.perf_counter()
        await run(*make())
        sequential.append(time.perf_counter() - started)
    left = [requests]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            await run(*make())

    engine_before = cpu_ticks(engine_pid) if engine_pid else 0
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - wall_before
    client_cpu = time.process_time() - cpu_before
    engine_cpu = (cpu_ticks(engine_pid) - engine_before) / TICK if engine_pid else 0.0
    return {"c1_p50_us": statistics.median(sequential) * 1e6, "rps": requests / wall,
            "client_us": client_cpu / requests * 1e6, "engine_us": engine_cpu / requests * 1e6}


def client_main(variant: str, requests: int, concurrency: int, switch_ms: float) -> None:
    sys.setswitchinterval(switch_ms / 1000)
    if variant == "local":
        service = StubEngine()
        found = asyncio.run(measure(service.run, requests, concurrency, None))
    else:
        run_dir = tempfile.mkdtemp(prefix="hop-")
        endpoint = f"ipc://{run_dir}/engine.sock"
        command = [sys.executable, __file__, "--engine", endpoint, "--switch-ms", str(switch_ms)]
        engine = subprocess.Popen(command)
        try:
            link = load_link()

            async def main() -> dict:
                client = engine_client(link, endpoint)
                await client.connect()
                try:
                    return await measure(client.run, requests, concurrency, engine.pid)
                finally:
                    await client.close()

            found = asyncio.run(main())
        finally:
            engine.terminate()
            engine.wait()
            for name in os.listdir(run_dir):
                os.unlink(os.path.join(run_dir, name))
            os.rmdir(run_dir)
    print(json.dumps(found), flush=True)


COLUMNS = [("c1_p50_us", "c=1 round trip p50, us", "{:.0f}"), ("rps", "req/s at the concurrency", "{:.0f}"),
           ("client_us", "client CPU/request, us", "{:.1f}"), ("engine_us", "engine CPU/request, us", "{:.1f}")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--switch-ms", type=float, default=0.5, help="sys.setswitchinterval in both processes")
    parser.add_argument("--against", help="also time link.py as it was at this git revision")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        return engine_main(args.engine, args.switch_ms)
    if args.client:
        return client_main(args.client, args.requests, args.concurrency, args.switch_ms)

    # Each variant's PYTHONPATH: None is this checkout's package.
    variants: dict[str, str | None] = {"local": None, "link": None}
    worktree = None
    if args.against:
        worktree = tempfile.mkdtemp(prefix="hop-against-")
        subprocess.run(["git", "worktree", "add", "--detach", worktree, args.against], cwd=ROOT, check=True,
                       capture_output=True)
        variants[f"link@{args.against}"] = worktree
    names = list(variants)
    found: dict[str, list[dict]] = {name: [] for name in names}
    try:
        for round_ in range(args.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                command = [sys.executable, __file__, "--client", name.split("@")[0], "--requests", str(args.requests),
                           "--concurrency", str(args.concurrency), "--switch-ms", str(args.switch_ms)]
                env = dict(os.environ)
                if variants[name]:
                    env["PYTHONPATH"] = os.pathsep.join(filter(None, [variants[name], env.get("PYTHONPATH")]))
                out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
                found[name].append(json.loads(out.strip().splitlines()[-1]))
                print(f"round {round_ + 1} {name}: {found[name][-1]}", file=sys.stderr, flush=True)
    finally:
        if worktree:
            subprocess.run(["git", "worktree", "remove", "--force", worktree], cwd=ROOT, check=False)
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, {args.rounds} rounds of {args.requests} requests, "
          f"concurrency {args.concurrency}, switch interval {args.switch_ms:g} ms; median (min..max)\n")
    print("| variant | " + " | ".join(title for _, title, _ in COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for name in names:
        cells = []
        for key, _, form in COLUMNS:
            values = [r[key] for r in found[name]]
            cells.append(f"{form.format(statistics.median(values))} ({form.format(min(values))}.."
                         f"{form.format(max(values))})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
