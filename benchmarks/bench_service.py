"""Service benchmarks against what users do without per-thread devices, measured side by side in one run.

    python benchmarks/bench_service.py [--model digits] [--devices 2] [--seconds 10] [--connections 16]

Needs ``wrk`` (Debian package). Everything runs on this machine's cores with
sim devices; the load generator shares the cores with the server, as it would
for any in-process comparison. Prints a Markdown table and writes the raw
results to ``results/bench_service.json``, and ``docs/bench_service_<model>.png``
with the numbers it draws beside it in ``docs/bench_service_<model>.json``
(``--replot`` that JSON to draw it again).

  a. bare model ceiling: preprocess -> to(device) -> execute -> postprocess called
     directly, 1 thread and N threads (one per device), vs the service at
     concurrency 1 (p50) and at saturation (throughput). Concurrency 1 runs
     twice: in interleaved rounds (a hot bare loop, then HTTP floor, then
     service, wrk -c1) reporting the median of the per-round differences, and
     request by request (the three take turns one request at a time, timed by
     one client) reporting the median of the per-turn differences. The HTTP
     floor (benchmarks/http_floor_app.py) is the bare forward inline in a
     FastAPI handler, what HTTP alone adds;
  b. global-lock workaround: benchmarks/global_lock_app.py, same devices;
  c. process per device: N service processes with one device each, vs one;
  d. dynamic batching on (max batch 8) vs off (max batch 1), at saturation.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from placeenv.testing import free_port  # the tests' too; front_end_ceiling, peers, profile take it from here

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
from charts import DOCS, label_bars, publish, pyplot, replot  # noqa: E402


def save_results(name: str, args, **found) -> Path:
    """``results/<name>.json``: today's date, the run's arguments and what it found."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"date": str(datetime.date.today()), "args": vars(args), **found}, indent=1))
    return path


def example_body(model: str) -> str:
    if model == "digits":
        inputs = [[0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8,
                   8, 0, 0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13,
                   10, 0, 0, 0]]
    else:
        inputs = [[[[0.25] * 32] * 32] * 3]
    return json.dumps({"model": model, "inputs": inputs})


# -- bare model (a child process: `bench_service.py bare ...`, driven line by line on stdin) -------


def bare(model: str, devices: list[str]) -> None:
    """Answer "single SECONDS" / "threads SECONDS" / "one CALLS" on stdin with a JSON line {rps, p50_ms}.

    "one CALLS" runs CALLS calls on the first thread only (for request-by-request turns).

    One loop thread per device, started once and kept: every round measures the
    same threads, replicas and warm caches.
    """
    import placeenv.sim

    placeenv.sim.prepare(4)
    import paddle

    import placeenv
    from placeenv.serve.engine.standalone import Standalone

    inputs = json.loads(example_body(model))["inputs"]
    go = [threading.Event() for _ in devices]
    plan: dict = {}

    def loop(index: int, device: str) -> None:
        paddle.set_device(device)
        replica = Standalone(model, device)
        arrays = replica.examples(inputs)
        for _ in range(5):  # warm-up
            replica.infer(arrays)
        ready.wait()
        while True:
            go[index].wait()
            go[index].clear()
            plan["barrier"].wait()
            samples, stop_at, calls = plan["samples"][index], time.perf_counter() + plan["seconds"], plan["calls"]
            while (len(samples) < calls) if calls else (time.perf_counter() < stop_at):
                t = time.perf_counter()
                replica.infer(arrays)  # what a worker does with one request, minus the queue
                samples.append(time.perf_counter() - t)
            plan["done"].release()

    ready = threading.Barrier(len(devices) + 1)
    for i, device in enumerate(devices):
        threading.Thread(target=loop, args=(i, device), daemon=True).start()
    ready.wait()
    print("ready", flush=True)
    for line in sys.stdin:
        what, amount = line.split()
        group = range(len(devices) if what == "threads" else 1)
        seconds, calls = (0.0, int(amount)) if what == "one" else (float(amount), 0)
        plan.update(seconds=seconds, calls=calls, samples=[[] for _ in devices],
                    barrier=threading.Barrier(len(group)), done=threading.Semaphore(0))
        for i in group:
            go[i].set()
        for _ in group:
            plan["done"].acquire()
        flat = [t for samples in plan["samples"] for t in samples]
        rps = len(flat) / seconds if seconds else None
        print(json.dumps({"rps": rps, "p50_ms": statistics.median(flat) * 1000}), flush=True)


class Bare:
    def __init__(self, model: str, devices: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "bare", "--model", model, "--devices", str(len(devices))],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        while self.proc.stdout.readline().strip() != "ready":
            if self.proc.poll() is not None:
                raise RuntimeError("the bare-model process exited")

    def run(self, what: str, amount: float) -> dict:
        self.proc.stdin.write(f"{what} {amount}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


# -- servers and load ------------------------------------------------------------------------------


class Server:
    """A server process, started and ready: ``ready(server)`` says when (default: an HTTP probe)."""

    def __init__(self, command: list[str], env: dict, port: int, ready=None, cwd: Path = ROOT) -> None:
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        full = {k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}
        full.update(env)
        self.proc = subprocess.Popen(command, env=full, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 240
        probe = "/readyz" if "placeenv.serve" in command else "/openapi.json"
        ready = ready or (lambda server: httpx.get(server.url + probe, timeout=2).status_code == 200)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{command} exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if ready(self):
                    return
            except Exception:  # not up yet: refused, reset, unavailable
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{command} not ready")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- the process tree (a service with front ends is a supervisor and its children) ---------------


def processes() -> dict[int, tuple[int, int, str, int]]:
    """Every process now: {pid: (parent pid, start time, name, CPU time used)}, times in clock ticks."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if rest[0] != "Z":  # a zombie holds no memory and is its parent's to reap
            found[int(entry.name)] = (int(rest[1]), int(rest[19]), name, int(rest[11]) + int(rest[12]))
    return found


def tree(*roots: int) -> dict[int, tuple[int, str, int]]:
    """``roots`` and all their descendants: {pid: (start time, name, CPU time)}. The start time
    tells a pid reused later from the same process."""
    table = processes()
    children = collections.defaultdict(list)
    for pid, (parent, *_) in table.items():
        children[parent].append(pid)
    found, todo = {}, list(roots)
    while todo:
        pid = todo.pop()
        if pid in table:
            found[pid] = table[pid][1:]
            todo.extend(children[pid])
    return found


def cpu_cores(roots: list[int], work) -> tuple[float, object]:
    """The CPU the trees of ``roots`` use while ``work()`` runs, in cores (1.0: one core all the
    time), and what ``work`` returned."""
    before, began = tree(*roots), time.perf_counter()
    done = work()
    seconds, after = time.perf_counter() - began, tree(*roots)
    ticks = sum(cpu - before[pid][2] if pid in before and before[pid][0] == start else cpu
                for pid, (start, _, cpu) in after.items())
    return ticks / os.sysconf("SC_CLK_TCK") / seconds, done


def service(devices: list[str], model: str, port: int | None = None, checkout: Path = ROOT, **settings) -> Server:
    """The service of the checkout at ``checkout`` (``python -m placeenv.serve`` run there imports it)."""
    port = port or free_port()
    env = {"PLACEENV_DEVICES": ",".join(devices), "PLACEENV_MODELS": model, "PLACEENV_PORT": str(port),
           "PLACEENV_WORKERS_PER_DEVICE": "1", "PLACEENV_LOG_LEVEL": "warning", "PLACEENV_QUEUE_CAPACITY": "256"}
    env.update({f"PLACEENV_{k.upper()}": str(v) for k, v in settings.items()})
    return Server([sys.executable, "-m", "placeenv.serve"], env, port, cwd=checkout)


def wrk(urls: list[str], body: str | bytes, connections: int, seconds: float, path: str = "/predict",
        headers: dict[str, str] | None = None) -> dict:
    """Run wrk against each URL at once (connections split among them); sum throughput. A JSON body
    (text), or any bytes with the ``headers`` they need."""
    if isinstance(body, str):
        literal, headers = json.dumps(body), {"Content-Type": "application/json", **(headers or {})}
    else:  # every byte as a Lua decimal escape: a binary body in a Lua string
        literal = '"' + "".join(f"\\{b:03d}" for b in body) + '"'
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(f'wrk.method = "POST"\nwrk.body = {literal}\n'
                     + "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in (headers or {}).items()))
    per = max(1, connections // len(urls))
    procs = [
        subprocess.Popen(["wrk", "-t1", f"-c{per}", f"-d{int(seconds)}s", "--latency", "-s", script.name,
                          url + path], stdout=subprocess.PIPE, text=True)
        for url in urls
    ]
    outs = [p.communicate()[0] for p in procs]
    os.unlink(script.name)
    rps = sum(float(re.search(r"Requests/sec:\s+([\d.]+)", o).group(1)) for o in outs)
    errors = sum(int(m.group(1)) for o in outs for m in [re.search(r"Non-2xx or 3xx responses: (\d+)", o)] if m)
    p50 = [_ms(re.search(r"\s50%\s+([\d.]+\w+)", o).group(1)) for o in outs]
    p99 = [_ms(re.search(r"\s99%\s+([\d.]+\w+)", o).group(1)) for o in outs]
    return {"rps": rps, "p50_ms": max(p50), "p99_ms": max(p99), "non_2xx": errors}


def process_per_device(devices: list[str], model: str, body: str, connections: int,
                       seconds: float) -> tuple[dict, float]:
    """One service process per device under one wrk load: (wrk result, their total RSS in MB)."""
    servers = [service([d], model) for d in devices]
    try:
        for s in servers:
            warm(s.url, body, 10)
        return wrk([s.url for s in servers], body, connections, seconds), sum(s.rss_mb() for s in servers)
    finally:
        for s in servers:
            s.stop()


def metric_samples(url: str) -> list:
    """Every sample the service's /metrics shows now."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def batch_totals(url: str) -> tuple[float, float]:
    """The examples and forward passes the service at ``url`` has run so far, every model's, from
    its ``inference_batch_size`` histogram: two readings give the mean batch between them."""
    samples = metric_samples(url)
    return tuple(sum(s.value for s in samples if s.name == f"inference_batch_size_{part}")
                 for part in ("sum", "count"))


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


class OneAtATime:
    """One keep-alive connection that sends one ``POST /predict`` at a time and times it, client side."""

    def __init__(self, port: int, body: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = body.encode()
        self.request = (f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(data)}\r\n\r\n").encode() + data

    def __call__(self) -> float:
        """Milliseconds from sending the request to the last byte of a 200 answer."""
        start = time.perf_counter()
        self.sock.sendall(self.request)
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += self._recv()
        head, rest = buffer.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
        while len(rest) < length:
            rest += self._recv()
        elapsed = (time.perf_counter() - start) * 1000
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answer {head.splitlines()[0]!r}")
        return elapsed

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise RuntimeError("connection closed")
        return chunk

    def close(self) -> None:
        self.sock.close()


def request_by_request(model_only: Bare, floor: Server, ours: Server, body: str, seconds: float) -> list[dict]:
    """Concurrency 1 with bare call, HTTP floor and service taking turns one request at a time.

    Every turn sees the same moment of the VM, and each of the three waits while
    the other two run: the bare call, too, starts after a pause, as a worker does.
    """
    steps = {"bare": lambda: model_only.run("one", 1)["p50_ms"], "floor": OneAtATime(floor.port, body),
             "service": OneAtATime(ours.port, body)}
    names, turns = list(steps), []
    stop_at = time.perf_counter() + seconds
    while time.perf_counter() < stop_at:
        k = len(turns) % len(names)  # rotate who goes first
        turns.append({name: steps[name]() for name in names[k:] + names[:k]})
    for name in ("floor", "service"):
        steps[name].close()
    return turns


def paired(samples: list[dict]) -> dict:
    """Medians of {bare, floor, service} ms samples (rounds or turns), and of the paired differences."""
    medians = {k: statistics.median(x[k] for x in samples) for k in ("bare", "floor", "service")}
    return {**medians, "n": len(samples),
            "service_over": statistics.median(x["service"] - x["bare"] for x in samples),
            "floor_over": statistics.median(x["floor"] - x["bare"] for x in samples)}


def warm(url: str, body: str, n: int = 20) -> None:
    with httpx.Client(timeout=60) as http:
        for _ in range(n):
            http.post(url + "/predict", content=body, headers={"content-type": "application/json"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="all", choices=["all", "bare"])
    parser.add_argument("--model", default="digits")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds at concurrency 1")
    parser.add_argument("--round-seconds", type=float, default=3)
    parser.add_argument("--turn-seconds", type=float, default=30,
                        help="concurrency 1 request by request: bare, floor and service take turns this long")
    parser.add_argument("--replot", type=Path, metavar="JSON",
                        help="draw the PNG beside this saved chart JSON again, measuring nothing")
    args = parser.parse_args()
    if args.replot:
        print(replot(args.replot, plot))
        return
    devices = [f"sim:{i}" for i in range(args.devices)]
    if args.command == "bare":
        bare(args.model, devices)
        return
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    body, secs, conns = example_body(args.model), args.seconds, args.connections
    r: dict = {"model": args.model, "devices": devices, "seconds": secs, "connections": conns,
               "rounds": args.rounds, "date": str(datetime.date.today()),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores"}

    # (a) at concurrency 1, in interleaved rounds: bare forward, HTTP floor, service. This VM's
    # speed drifts by 20-30% over minutes; each round compares the three under the same drift.
    ours, floor, model_only = service(devices, args.model), None, Bare(args.model, devices)
    try:
        port = free_port()
        floor = Server([sys.executable, "-m", "uvicorn", "benchmarks.http_floor_app:app", "--port", str(port),
                        "--log-level", "warning"], {"PLACEENV_DEVICES": devices[0],
                                                     "PLACEENV_MODELS": args.model}, port)
        warm(ours.url, body)
        warm(floor.url, body)
        rounds = []
        for _ in range(args.rounds):
            rounds.append({
                "bare": model_only.run("single", args.round_seconds)["p50_ms"],
                "floor": wrk([floor.url], body, 1, args.round_seconds)["p50_ms"],
                "service": wrk([ours.url], body, 1, args.round_seconds)["p50_ms"],
            })
        r["c1_rounds"] = rounds
        r["c1_turns"] = request_by_request(model_only, floor, ours, body, args.turn_seconds)
        r["bare"] = {"threads": model_only.run("threads", secs)}
        r["service_sat"] = wrk([ours.url], body, conns, secs)
        r["service_rss_mb"] = ours.rss_mb()
    finally:
        ours.stop()
        model_only.stop()
        if floor is not None:
            floor.stop()

    port = free_port()
    lock = Server([sys.executable, "-m", "uvicorn", "benchmarks.global_lock_app:app", "--port", str(port),
                   "--log-level", "warning"], {"PLACEENV_DEVICES": ",".join(devices),
                                                "PLACEENV_MODELS": args.model}, port)
    try:
        warm(lock.url, body)
        r["global_lock_sat"] = wrk([lock.url], body, conns, secs)
    finally:
        lock.stop()

    r["process_per_device_sat"], r["process_per_device_rss_mb"] = process_per_device(
        devices, args.model, body, conns, secs)

    unbatched = service(devices, args.model, MAX_BATCH_SIZE=1, MAX_BATCH_DELAY_MS=0)
    try:
        warm(unbatched.url, body)
        r["batching_off_sat"] = wrk([unbatched.url], body, conns, secs)
    finally:
        unbatched.stop()

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_service.json").write_text(json.dumps(r, indent=2))
    print(table(r))
    print(publish(chart(r), DOCS / f"bench_service_{args.model}.png", plot))


def table(r: dict) -> str:
    n = len(r["devices"])
    bare, sat = r["bare"], r["service_sat"]
    c1, turns = paired(r["c1_rounds"]), paired(r["c1_turns"])
    lock, ppd, off = r["global_lock_sat"], r["process_per_device_sat"], r["batching_off_sat"]
    rows = [
        ("a", f"p50 at concurrency 1: service vs bare forward (1 thread); median of {c1['n']} paired rounds",
         f"{c1['service']:.2f} ms vs {c1['bare']:.2f} ms", f"{c1['service_over']:+.2f} ms", "<= +1 ms",
         c1["service_over"] <= 1),
        ("a", "reference: HTTP floor (bare forward inline in a FastAPI handler) vs bare forward",
         f"{c1['floor']:.2f} ms vs {c1['bare']:.2f} ms", f"{c1['floor_over']:+.2f} ms", "-", True),
        ("a", f"p50 at concurrency 1, request by request: service vs bare forward; median of {turns['n']} turns", f"{turns['service']:.2f} ms vs {turns['bare']:.2f} ms", f"{turns['service_over']:+.2f} ms",
         "<= +1 ms", turns["service_over"] <= 1),
        ("a", "reference: HTTP floor vs bare forward, request by request",
         f"{turns['floor']:.2f} ms vs {turns['bare']:.2f} ms", f"{turns['floor_over']:+.2f} ms", "-", True),
        ("a", f"saturated throughput: service vs bare forward ({n} threads)",
         f"{sat['rps']:.0f} vs {bare['threads']['rps']:.0f} req/s",
         f"{sat['rps'] / bare['threads']['rps']:.0%}", ">= 90%", sat["rps"] >= 0.9 * bare["threads"]["rps"]),
        ("b", f"throughput: service vs global-lock app ({n} devices)", f"{sat['rps']:.0f} vs {lock['rps']:.0f} req/s",
         f"{sat['rps'] / lock['rps']:.2f}x", ">= 1.8x", sat["rps"] >= 1.8 * lock["rps"]),
        ("c", f"throughput: one process vs {n} processes", f"{sat['rps']:.0f} vs {ppd['rps']:.0f} req/s",
         f"{sat['rps'] / ppd['rps']:.2f}x", "same", sat["rps"] >= 0.9 * ppd["rps"]),
        ("c", f"resident memory: one process vs {n} processes",
         f"{r['service_rss_mb']:.0f} vs {r['process_per_device_rss_mb']:.0f} MB",
         f"{r['service_rss_mb'] / r['process_per_device_rss_mb']:.2f}", f"<= 1/{n} = {1 / n:.2f}",
         r["service_rss_mb"] <= r["process_per_device_rss_mb"] / n),
        ("d", "throughput: batching on (max 8) vs off (max 1)", f"{sat['rps']:.0f} vs {off['rps']:.0f} req/s",
         f"{sat['rps'] / off['rps']:.2f}x", "> 1x", sat["rps"] > off["rps"]),
    ]
    head = (f"Service benchmarks, {r['date']}, {r['machine']}, model {r['model']}, {n} sim devices x 1 worker, "
            f"wrk {r['connections']} connections, {r['seconds']:g} s per run\n\n"
            "| # | comparison | measured | ratio | target | met |\n|---|---|---|---|---|---|\n")
    extra = (f"\nservice p99 at saturation {sat['p99_ms']:.1f} ms; non-2xx: service {sat['non_2xx']}, "
             f"global lock {lock['non_2xx']}, per-device {ppd['non_2xx']}, batching off {off['non_2xx']}")
    return head + "\n".join(f"| {a} | {b} | {c} | {d} | {e} | {'yes' if f else 'NO'} |" for a, b, c, d, e, f in rows) + extra


def chart(r: dict) -> dict:
    """The numbers the chart draws, from a run's raw results (``docs/bench_service_<model>.json``)."""
    n = len(r["devices"])
    saturated = {f"bare forward, {n} threads": r["bare"]["threads"], "service": r["service_sat"],
                 "global-lock app": r["global_lock_sat"], f"{n} processes": r["process_per_device_sat"],
                 "batching off": r["batching_off_sat"]}
    return {
        "model": r["model"], "devices": n, "date": r["date"], "machine": r["machine"],
        "connections": r["connections"],
        "throughput_rps": {way: x["rps"] for way, x in saturated.items()},
        "p99_ms": {way: x["p99_ms"] for way, x in saturated.items() if "p99_ms" in x},
        "memory_mb": {"one process": r["service_rss_mb"], f"{n} processes": r["process_per_device_rss_mb"]},
        "c1_p50_ms": {f"in rounds ({len(r['c1_rounds'])})": paired(r["c1_rounds"]),
                      f"request by request ({len(r['c1_turns'])} turns)": paired(r["c1_turns"])},
    }


def plot(chart: dict, path: Path) -> None:
    plt = pyplot()
    fig, (thr, lat, mem) = plt.subplots(1, 3, figsize=(16, 4.8), width_ratios=[1.5, 1, 0.7])
    _throughput(thr, chart)
    _c1_latency(lat, chart)
    _memory(mem, chart)
    fig.suptitle(f"placeenv service benchmarks: {chart['model']}, {chart['devices']} sim devices, "
                 f"{chart['date']}, {chart['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


COLOURS = {"bare": "grey", "service": "tab:green", "global": "tab:red", "process": "tab:orange",
           "batching": "tab:blue", "floor": "tab:purple"}


def _colour(way: str) -> str:
    return next((c for word, c in COLOURS.items() if word in way), "grey")


def _throughput(ax, chart: dict) -> None:
    """Saturated requests/s per way; the p99 under the same load where the run recorded it."""
    ways, rps = list(chart["throughput_rps"]), list(chart["throughput_rps"].values())
    bars = ax.bar([w.replace(", ", ",\n").replace(" app", "\napp") for w in ways], rps,
                  color=[_colour(w) for w in ways])
    p99 = chart.get("p99_ms", {})
    label_bars(ax, bars, [f"{v:.0f}" + (f"\np99 {p99[w]:.3g} ms" if w in p99 else "")
                          for w, v in zip(ways, rps, strict=True)])
    ax.set(title=f"Saturated throughput (wrk, {chart['connections']} connections)", ylabel="requests/s")


def _c1_latency(ax, chart: dict) -> None:
    """What HTTP alone (the floor) and the whole service add to the bare forward's p50 at concurrency 1."""
    ways = list(chart["c1_p50_ms"])
    width = 0.38
    for i, (key, name) in enumerate((("floor_over", "HTTP floor"), ("service_over", "service"))):
        values = [chart["c1_p50_ms"][w][key] for w in ways]
        bars = ax.bar([j + (i - 0.5) * width for j in range(len(ways))], values, width, label=name,
                      color=_colour(name.split()[-1]))
        label_bars(ax, bars, [f"+{v:.2f}" for v in values])
    ax.axhline(1.0, color="k", linestyle="--", linewidth=1, label="target: service ≤ +1 ms")
    ax.set_xticks(range(len(ways)), [f"{w}\nbare {chart['c1_p50_ms'][w]['bare']:.2f} ms, "
                                      f"service {chart['c1_p50_ms'][w]['service']:.2f} ms" for w in ways],
                  fontsize=8)
    ax.set(title="p50 at concurrency 1, added to the bare forward", ylabel="ms over the bare forward")
    # Headroom above the bars and the target line: the legend sits there, clear of both.
    top = max(max(x["service_over"], x["floor_over"]) for x in chart["c1_p50_ms"].values())
    ax.set_ylim(0, 1.45 * max(top, 1.0))
    ax.legend(fontsize=8, loc="upper center", ncol=3)


def _memory(ax, chart: dict) -> None:
    ways, mb = list(chart["memory_mb"]), list(chart["memory_mb"].values())
    bars = ax.bar(ways, mb, color=["tab:green", "tab:orange"])
    label_bars(ax, bars, [f"{v:.0f} MB" for v in mb])
    ax.set(title="Resident memory", ylabel="MB")


if __name__ == "__main__":
    main()
