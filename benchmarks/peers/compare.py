"""The service against its peers, LitServe and Ray Serve, on the same model, devices and load.

    python benchmarks/peers/compare.py [--rounds 3] [--seconds 5] [--connections 16] [--devices 2]
                                       [--ray-python /tmp/rayvenv/bin/python | --skip-ray]
                                       [--systems ours,litserve,ray]

Needs ``wrk`` (Debian package) and LitServe 0.2.19 in this Python (``pip install -e '.[peers]'``);
Ray Serve runs from its own virtual environment (see benchmarks/peers/ray_app.py for the
three commands that make it). Every system serves the bundled digits model on sim:0..N-1
with one worker per device, batches of at most 8 and a 2 ms batching wait, and the same
model code: the repository's ``model.py``, loaded by the service's own loader
(benchmarks/peers/replica.py), so what differs is each system's serving machinery:

  ours      ``python -m placeenv.serve``: one process, a worker thread per device
  per-device  the same service as N processes with one device each, the load split evenly
            (c=1: the first process), as a process-per-device deployment of it runs
  LitServe  benchmarks/peers/litserve_app.py: an inference worker process per device, one
            HTTP server process per worker (LitServe's default) and a manager process
  Ray Serve benchmarks/peers/ray_app.py: a local Ray cluster started by the app (GCS,
            raylet, dashboard, agents), the HTTP proxy actor, one replica actor per device

One system is alive at a time: in each round, every system in turn (the order rotated
each round) is started, measured and stopped before the next starts, so none takes cores
or memory from another. Per system per round:

  start-up     spawn to the first 200 from /predict, after the system says every worker is
               ready (ours /readyz, LitServe /health, Ray Serve: serve.run has returned)
  throughput   wrk, ``--connections`` connections for ``--seconds``, the digits /predict body
               (after 20 requests and 1 s of wrk to warm up)
  c=1 p50/p99  wrk -c1 for ``--seconds``, its latency percentiles
  PSS          after the load, summed over the server process and all its descendants
               (/proc/PID/smaps_rollup), so shared pages count once in total
  idle CPU     the CPU time the tree uses in 3 s without requests, right after start-up
               (before the warm-up), in % of one core: cores an idle system takes from
               everything else on the machine, the load generator included
  load CPU     the CPU time the tree uses during the saturated wrk run, in cores: one
               process's Python runs under one GIL, so on a Python-heavy model it cannot go
               far past one core, while N processes can use N
  CPU a request  load CPU / throughput: what the system spends on a request
  machine busy   every process's CPU during the same run (/proc/stat), the load generator
               included, in cores: below the machine's cores, the machine had cores to spare,
               so a system that stops short of them is held back by something of its own

Stopping: ours by SIGTERM; LitServe by SIGINT to its process group (it leads one: SIGTERM
to the main process leaves the workers behind); Ray Serve by SIGINT to the app, which shuts
Serve and Ray down. Afterwards no process of the tree may remain, or the run fails; the time
from the signal until the last one is gone is reported per round (stop).

Prints a Markdown table: per metric the median and min..max of the per-round values, and
ours/peer as the median and min..max of the per-round ratios (each ratio from one round,
so both systems of a ratio ran minutes apart at most; above 1 favours ours for throughput,
below 1 for the rest). Writes ``results/peers.json``, with each round's values and its PSS
by process.

Settings beyond each system's defaults: LitServe none (its default mp queues; litserve_app.py
--fast-queue, ZeroMQ answers, measured no faster here); Ray Serve warnings only and no access
log (as ours and LitServe log), and max_ongoing_requests 16 instead of 5, so a replica can
hold a full batch of 8.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import (  # noqa: E402
    Server, cpu_cores, example_body, free_port, processes, save_results, service, tree, warm, wrk,
)

MODEL = "digits"
NAMES = {"ours": "ours", "per-device": "ours, a process per device", "litserve": "LitServe", "ray": "Ray Serve"}
METRICS = [  # key, label, format
    ("rps", "throughput, req/s", "{:.0f}"),
    ("p50_ms", "c=1 p50, ms", "{:.2f}"),
    ("p99_ms", "c=1 p99, ms", "{:.2f}"),
    ("pss_mb", "PSS, MB", "{:.0f}"),
    ("startup_s", "start-up, s", "{:.1f}"),
    ("idle_cpu_pct", "idle CPU, % of a core", "{:.0f}"),
    ("load_cores", "CPU under saturated load, cores", "{:.2f}"),
    ("cpu_us", "CPU a request under saturated load, us", "{:.0f}"),
    ("machine_cores", "whole machine busy under load, cores", "{:.2f}"),
]


# -- the process tree ------------------------------------------------------------------------------


def machine_busy() -> tuple[int, int]:
    """(all CPU time, busy CPU time) of the whole machine so far, in clock ticks (/proc/stat)."""
    ticks = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user and nice);
    # steal is time the hypervisor gave to others: neither this machine's work nor idle here
    idle, iowait, steal = ticks[3], ticks[4], ticks[7]
    total = sum(ticks[:8]) - steal
    return total, total - idle - iowait


def idle_cpu(roots: list[int], seconds: float) -> float:
    """CPU the trees of ``roots`` use while no request comes, in % of one core over ``seconds``."""
    return 100 * cpu_cores(roots, lambda: time.sleep(seconds))[0]


def label(pid: int, name: str) -> str:
    """A name for a process in the PSS breakdown: for Python, its script, module or
    multiprocessing role (their process name is just "python")."""
    if not name.startswith("python"):
        return name
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return name
    for role in ("multiprocessing.spawn", "multiprocessing.resource_tracker", "multiprocessing.forkserver"):
        if any(role in arg for arg in args):
            return role
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1]
    return next((Path(arg).name for arg in args[1:] if arg.endswith(".py")), name)


def pss(pids) -> tuple[float, dict[str, float]]:
    """Summed PSS of ``pids`` in MB, and the same by process (``label``)."""
    by_name: dict[str, float] = collections.defaultdict(float)
    for pid, (_, name, _) in pids.items():
        try:
            lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        kb = next(int(line.split()[1]) for line in lines if line.startswith("Pss:"))
        by_name[label(pid, name)] += kb / 1024
    return sum(by_name.values()), dict(by_name)


def survivors(pids: dict[int, tuple[int, str, int]], wait_s: float) -> list[str]:
    """Those of ``pids`` (a ``tree`` snapshot) still running after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        now = processes()
        alive = [f"{pid} {name}" for pid, (start, name, _) in pids.items()
                 if pid in now and now[pid][1] == start]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


# -- the systems ----------------------------------------------------------------------------------


class Running:
    """A started system: its ``Server`` (url, port, proc) and how it stops."""

    def __init__(self, server: Server, stop_signal: signal.Signals, group: bool) -> None:
        self.server, self.stop_signal, self.group = server, stop_signal, group
        # Server reads stderr only if the process dies while starting; from here on a thread
        # keeps reading it, so a chatty server never blocks on a full pipe. The tail is kept.
        self.stderr: collections.deque = collections.deque(maxlen=40)
        threading.Thread(target=lambda: self.stderr.extend(iter(server.proc.stderr.readline, b"")),
                         daemon=True).start()

    @property
    def urls(self) -> list[str]:
        return [self.server.url]

    @property
    def roots(self) -> list[int]:
        return [self.server.proc.pid]

    def stop(self) -> list[str]:
        """Stop every process of the tree; the ones that survived (then killed), if any."""
        proc, pids = self.server.proc, tree(self.server.proc.pid)
        if self.group:
            os.killpg(proc.pid, self.stop_signal)
        else:
            proc.send_signal(self.stop_signal)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        left = survivors(pids, 15)
        for entry in left:  # ours to clean up: they belong to this run's system
            try:
                os.kill(int(entry.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left


class Several:
    """Systems started side by side (ours, a process per device), measured and stopped as one."""

    def __init__(self, parts: list[Running]) -> None:
        self.parts = parts
        self.urls = [url for part in parts for url in part.urls]
        self.roots = [root for part in parts for root in part.roots]
        self.stderr = [line for part in parts for line in part.stderr]

    def stop(self) -> list[str]:
        return [left for part in self.parts for left in part.stop()]


def started(make_server, stop_signal: signal.Signals, group: bool) -> Running:
    """``make_server()`` as a ``Running``. A Server that never becomes ready raises without a
    handle on its process: that process is found among this one's children and stopped."""
    before = {pid for pid, (parent, *_) in processes().items() if parent == os.getpid()}
    try:
        return Running(make_server(), stop_signal, group)
    except RuntimeError:
        for pid, (parent, *_) in processes().items():
            if parent == os.getpid() and pid not in before:
                left = tree(pid)
                (os.killpg if group else os.kill)(pid, stop_signal)
                for other in survivors(left, 30):
                    os.kill(int(other.split()[0]), signal.SIGKILL)
        raise


def start_ours(devices: list[str], frontends: int = 0, **settings) -> Running:
    # The service makes 4 sim devices unless told: sim:4 and up need the count.
    return started(lambda: service(devices, MODEL, SIM_DEVICES=len(devices), FRONTENDS=frontends, **settings),
                   signal.SIGTERM, group=False)


#: A variant of ours: "ours-k2" (2 front ends), "ours-s5" (GIL switch interval 5 ms), "ours-k1-s5".
VARIANT = re.compile(r"ours(?:-k(\d+))?(?:-s(\d+(?:\.\d+)?))?")


def start_variant(devices: list[str], name: str) -> Running:
    frontends, switch = VARIANT.fullmatch(name).groups()
    return start_ours(devices, int(frontends or 0),
                      **({"GIL_SWITCH_INTERVAL_MS": switch} if switch is not None else {}))


def start_per_device(devices: list[str]) -> Several:
    """One service process per device, as a process-per-device deployment runs it."""
    parts: list[Running] = []
    try:
        for device in devices:
            parts.append(started(lambda d=device: service([d], MODEL, SIM_DEVICES=len(devices)),
                                 signal.SIGTERM, group=False))
    except BaseException:
        Several(parts).stop()
        raise
    return Several(parts)


def start_litserve(devices: list[str]) -> Running:
    port = free_port()
    # setsid: the app leads a new process group (a child of this script is not a group
    # leader, so setsid execs in place and the pid stays the app's), the group SIGINT goes to.
    command = ["setsid", sys.executable, str(HERE / "litserve_app.py"), "--port", str(port),
               "--devices", str(len(devices)), "--model", MODEL]
    running = started(lambda: Server(command, {}, port), signal.SIGINT, group=True)
    server = running.server
    if os.getpgid(server.proc.pid) != server.proc.pid:
        running.stop()
        raise RuntimeError("setsid forked: the LitServe app does not lead its process group")
    # Its HTTP servers start once one inference worker is ready; /health says when all are.
    deadline = time.monotonic() + 240
    while httpx.get(server.url + "/health", timeout=5).status_code != 200:
        if time.monotonic() > deadline:
            running.stop()
            raise RuntimeError("LitServe: not every inference worker became ready")
        time.sleep(0.1)
    return running


def start_ray(devices: list[str], python: str) -> Running:
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        ready = Path(folder) / "ready"
        command = [python, str(HERE / "ray_app.py"), "--port", str(port), "--devices", str(len(devices)),
                   "--model", MODEL, "--ready-file", str(ready)]
        running = started(lambda: Server(command, {}, port), signal.SIGINT, group=False)
        # Its FastAPI app answers as soon as one replica runs; the app writes the file when
        # serve.run has returned, every replica running.
        deadline = time.monotonic() + 240
        while not ready.exists():
            if time.monotonic() > deadline or running.server.proc.poll() is not None:
                running.stop()
                raise RuntimeError("Ray Serve: the application never became ready")
            time.sleep(0.1)
    return running


def first_answer(url: str, body: str, deadline_s: float = 60) -> None:
    """Wait for a 200 from /predict with ``body``."""
    deadline = time.monotonic() + deadline_s
    with httpx.Client(timeout=10) as http:
        while True:
            try:
                answer = http.post(url + "/predict", content=body,
                                   headers={"content-type": "application/json"})
                if answer.status_code == 200:
                    return
                problem = f"{answer.status_code} {answer.text[:300]}"
            except httpx.HTTPError as exc:
                problem = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}/predict never answered 200: {problem}")
            time.sleep(0.02)


def measure(start, body: str, connections: int, seconds: float) -> dict:
    """One system, once: started, measured, stopped."""
    began = time.perf_counter()
    running = start()
    try:
        urls = running.urls  # several: the load is split evenly among them
        for url in urls:
            first_answer(url, body)
        result = {"startup_s": time.perf_counter() - began}
        result["idle_cpu_pct"] = idle_cpu(running.roots, 3)
        for url in urls:
            warm(url, body, 20)
        wrk(urls, body, connections, 1)
        machine = machine_busy()
        result["load_cores"], sat = cpu_cores(running.roots, lambda: wrk(urls, body, connections, seconds))
        total, busy = (after - before for after, before in zip(machine_busy(), machine, strict=True))
        # Whether the machine (server, wrk and all else) had cores to spare: a server below the
        # machine's cores is held back by something of its own, for one process its one GIL.
        result["machine_cores"] = busy / total * os.cpu_count()
        result["cpu_us"] = result["load_cores"] / sat["rps"] * 1e6
        one = wrk(urls[:1], body, 1, seconds)
        result.update(rps=sat["rps"], sat_p99_ms=sat["p99_ms"], p50_ms=one["p50_ms"], p99_ms=one["p99_ms"],
                      non_2xx=sat["non_2xx"] + one["non_2xx"])
        pids = tree(*running.roots)
        result["processes"] = len(pids)
        result["pss_mb"], result["pss_by_name"] = pss(pids)
    except BaseException:
        running.stop()
        sys.stderr.write(b"".join(running.stderr).decode(errors="replace")[-3000:])
        raise
    stopping = time.perf_counter()
    left = running.stop()
    result["stop_s"] = time.perf_counter() - stopping  # until every process of the tree is gone
    if left:
        raise RuntimeError(f"processes survived the stop (killed now): {', '.join(left)}")
    return result


# -- the report -----------------------------------------------------------------------------------


def spread(values: list[float], form: str) -> str:
    middle = form.format(statistics.median(values))
    if len(values) == 1:
        return middle
    return f"{middle} ({form.format(min(values))}..{form.format(max(values))})"


def table(found: dict[str, list[dict]]) -> str:
    systems, peers = list(found), [s for s in found if s != "ours" and "ours" in found]
    head = (["metric"] + [NAMES[s] for s in systems] + [f"ours/{NAMES[p]}" for p in peers])
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for key, label, form in METRICS:
        cells = [spread([r[key] for r in found[s]], form) for s in systems]
        for peer in peers:
            ratios = [o[key] / p[key] if p[key] else float("inf")
                      for o, p in zip(found["ours"], found[peer], strict=True)]
            cells.append(spread(ratios, "{:.2f}"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5, help="each wrk run (saturated, then c=1)")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--devices", type=int, default=2, help="sim devices, one worker each")
    parser.add_argument("--ray-python", default="/tmp/rayvenv/bin/python",
                        help="the Python of the virtual environment that has ray[serve] (see ray_app.py)")
    parser.add_argument("--skip-ray", action="store_true", help="compare with LitServe only")
    parser.add_argument("--systems", default="ours,per-device,litserve,ray",
                        help="which systems, in their round-1 order (default: all four); ours-kN is ours "
                        "with N front-end processes beside its engine (--frontends N), ours-sX ours with "
                        "a GIL switch interval of X ms, ours-kN-sX both")
    args = parser.parse_args()
    for name in args.systems.split(","):
        found = VARIANT.fullmatch(name.strip())
        if found and name.strip() != "ours":
            frontends, switch = found.groups()
            NAMES[name.strip()] = ", ".join(["ours"] + [f"{frontends} front ends"] * (frontends is not None)
                                            + [f"GIL switch {switch} ms"] * (switch is not None))
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    if args.skip_ray:
        names = [n for n in names if n != "ray"]
    if unknown := [n for n in names if n not in NAMES]:  # an ours-... that is not a VARIANT included
        sys.exit(f"unknown systems {unknown}; choose from {', '.join(NAMES)}")
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    if "ray" in names and not Path(args.ray_python).is_file():
        sys.exit(f"no {args.ray_python}: make Ray Serve's environment (see benchmarks/peers/ray_app.py) "
                 "or pass --skip-ray")
    devices = [f"sim:{i}" for i in range(args.devices)]
    body = example_body(MODEL)
    starts = {"ours": lambda: start_ours(devices), "per-device": lambda: start_per_device(devices),
              "litserve": lambda: start_litserve(devices),
              "ray": lambda: start_ray(devices, args.ray_python)}
    starts.update({name: lambda n=name: start_variant(devices, n) for name in names if name.startswith("ours-")})
    found: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got = measure(starts[name], body, args.connections, args.seconds)
            found[name].append(got)
            print(f"round {r + 1}/{args.rounds} {NAMES[name]}: {got['rps']:.0f} req/s, c=1 p50 "
                  f"{got['p50_ms']:.2f} ms p99 {got['p99_ms']:.2f} ms, PSS {got['pss_mb']:.0f} MB in "
                  f"{got['processes']} processes, start-up {got['startup_s']:.1f} s, "
                  f"idle CPU {got['idle_cpu_pct']:.0f}%, load CPU {got['load_cores']:.2f} cores "
                  f"({got['cpu_us']:.0f} us a request; machine {got['machine_cores']:.2f} cores), "
                  f"stop {got['stop_s']:.1f} s, "
                  f"non-2xx {got['non_2xx']}",
                  flush=True)

    print(f"\n{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, {MODEL} on "
          f"{','.join(devices)}, 1 worker per device, max batch 8; {args.rounds} rounds, "
          f"wrk {args.seconds:g} s, {args.connections} connections\n")
    print(table(found))
    save_results("peers", args, devices=devices, machine=f"{platform.machine()}, {os.cpu_count()} cores",
                 found=found)


if __name__ == "__main__":
    main()
