"""Does one service process feed N sim devices whose device time is inside Paddle's calls?

    python benchmarks/device_time.py [--counts 1,2,4,8] [--times-ms 20,10,5] [--backends jit,inference,auto]
                                     [--per-device 8@20,4@10] [--rounds 3] [--seconds 5]
                                     [--workers-per-device 2] [--connections-per-device 2]

device_scaling.py's null model sleeps in Python with the GIL released. Here the device time is
the sim device's own (``PLACEENV_SIM_TRANSFER_US``): every transfer into or out of a sim device's
memory takes device time on that device's one timeline, and the host waits for it inside Paddle's
call, as it waits for a GPU. Whether that wait lets the other workers run depends on the call:
``benchmarks/gil_probe.py`` finds a ``paddle.jit.load``ed layer's forward releases the GIL while
it waits and a Paddle Inference ``Predictor.run`` holds it.

The model is a tiny saved program, ``Linear(64, 10)`` (``paddle.jit.save``), batches of one
(``max_batch_size: 0``), one model repository per backend (``backend: jit | inference | auto``).

Calibration: a request's transfers differ by backend (the worker's ``move_to`` of the input,
then the forward's reads of device memory), so each backend's transfers per request are counted
in a child process on ``sim:0`` with device time off, walking the worker's path (``move_to``, then
the forward and ``.numpy()``), and ``PLACEENV_SIM_TRANSFER_US`` = round(T ms / transfers) gives a
request T ms of device time. A second child checks it with that setting (device ms a request).

Runs, for each backend, device time T and device count N:

  one process   the service on sim:0..N-1, --workers-per-device workers each
  per device    (only the --per-device pairs N@T) N service processes, one sim device each,
                the load split evenly, as device_scaling.py's

wrk with --connections-per-device connections per device, ``POST /predict``. Rounds are
interleaved (every run once a round, the order reversed every other round). Reports the median
throughput over rounds and its spread, its share of the ideal N * 1000 / T, the processes'
summed PSS, the host CPU a request costs (utime + stime of the process trees over the wrk run,
over its requests) and p50; and for the per-device pairs, one process over per device.
Raw results: ``results/device_time.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import cpu_cores, save_results, service, warm, wrk  # noqa: E402
from device_scaling import pss_mb  # noqa: E402

MODEL = "tiny"
# With max_batch_size 0 an example is the program's whole input, batch dimension included (as in
# Triton): one example of shape [1, 64]. ``[[0.5] * 64]`` alone is refused (400) as not a list of examples.
BODY = json.dumps({"model": MODEL, "inputs": [[[0.5] * 64]]})


# -- children: saving the program, counting a request's transfers ---------------------------------


def save_child(prefix: str) -> None:
    """``paddle.jit.save`` of Linear(64, 10) at ``prefix``, on the CPU (no sim in this process)."""
    import paddle

    paddle.set_device("cpu")
    paddle.seed(0)
    paddle.jit.save(paddle.nn.Linear(64, 10), prefix,
                    input_spec=[paddle.static.InputSpec([None, 64], "float32", "x")])


def calibrate_child(prefix: str, backend: str, transfer_us: int, requests: int) -> None:
    """One line of JSON: a request's transfers, bytes, device and wall ms on ``sim:0``, walking a
    worker's path for ``backend`` (after warm-up requests)."""
    import placeenv.sim

    placeenv.sim.prepare(devices=1, transfer_us=transfer_us)
    import numpy as np
    import paddle

    import placeenv
    from placeenv import PlaceEnv
    from placeenv.serve.models import inference
    from placeenv.tensors import host_tensor, move_to

    paddle.set_device("sim:0")
    place = placeenv.to_place("sim:0")
    resolved = inference.chosen(backend, "sim:0")
    if resolved == "inference":
        predictor = inference.create(Path(prefix), place, inference.InferenceOptions())

        def forward(x):
            return [t.numpy() for t in predictor.run([x])]
    else:
        layer = paddle.jit.load(prefix)
        layer.eval()
        env = PlaceEnv(place)

        def forward(x):
            with env, paddle.no_grad():
                out = layer(x)
            return out.numpy()

    array = np.full((1, 64), 0.5, np.float32)

    def request():
        return forward(move_to(host_tensor(array), place))

    for _ in range(5):
        request()
    before, started = placeenv.sim.stats(0), time.perf_counter()
    for _ in range(requests):
        request()
    wall, after = time.perf_counter() - started, placeenv.sim.stats(0)
    print(json.dumps({
        "backend": backend, "resolved": resolved, "transfer_us": transfer_us,
        "transfers_per_request": (after.transfers - before.transfers) / requests,
        "bytes_per_request": (after.bytes - before.bytes) / requests,
        "device_ms_per_request": (after.device_seconds - before.device_seconds) * 1000 / requests,
        "wall_ms_per_request": wall * 1000 / requests,
        "waits_per_request": (after.waits - before.waits) / requests,
    }), flush=True)


def child(*args: str) -> str:
    done = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")})
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed: {done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def calibrate(prefix: Path, backends: list[str], times: list[float], requests: int = 50) -> dict:
    """{backend: {"count": child's counts at transfer_us 0, "us": {T: µs}, "check": {T: child's counts}}}"""
    found = {}
    for backend in backends:
        count = json.loads(child("calibrate", str(prefix), backend, "0", str(requests)))
        transfers = count["transfers_per_request"]
        if transfers <= 0:
            raise RuntimeError(f"backend {backend}: no transfers a request on sim, device time cannot be set")
        us = {t: round(t * 1000 / transfers) for t in times}
        check = {t: json.loads(child("calibrate", str(prefix), backend, str(us[t]),
                                     str(max(5, int(200 / t)))))  # about 0.2 s of requests
                 for t in times}
        found[backend] = {"count": count, "us": us, "check": check}
    return found


# -- the runs -----------------------------------------------------------------------------------


def repository(tmp: Path, prefix: Path, backend: str) -> Path:
    """A repository under ``tmp`` holding the tiny program as ``tiny`` with this backend."""
    root = tmp / f"repository-{backend}"
    version = root / MODEL / "1"
    version.mkdir(parents=True)
    for suffix in (".json", ".pdiparams"):
        (version / f"model{suffix}").write_bytes(prefix.with_suffix(suffix).read_bytes())
    (root / MODEL / "config.yaml").write_text(f"max_batch_size: 0\nbackend: {backend}\n")
    return root


def check(url: str) -> dict:
    """One /predict, which must answer 200 with one example of [1, 10] outputs: the body works."""
    answer = httpx.post(url + "/predict", content=BODY, headers={"content-type": "application/json"},
                        timeout=60)
    if answer.status_code != 200:
        raise RuntimeError(f"{url}/predict answered {answer.status_code}: {answer.text[:500]}")
    got = answer.json()
    values = list(got["outputs"][0].values())[0] if len(got["outputs"]) == 1 else None
    if not (isinstance(values, list) and len(values) == 1 and len(values[0]) == 10):
        raise RuntimeError(f"unexpected answer: {answer.text[:500]}")
    return got


def start(settings: list[dict]) -> list:
    """Servers started at once (each ``service(**settings)``); all of them, or none left running."""
    with concurrent.futures.ThreadPoolExecutor(len(settings)) as pool:
        futures = [pool.submit(lambda s: service(**s), s) for s in settings]
        concurrent.futures.wait(futures)
    servers = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for s in servers:
            s.stop()
        raise failed[0]
    return servers


def measure(servers, n: int, connections: int, seconds: float) -> dict:
    answer = check(servers[0].url)
    for s in servers:
        warm(s.url, BODY, 10)
    started = time.perf_counter()
    cores, result = cpu_cores([s.proc.pid for s in servers],
                              lambda: wrk([s.url for s in servers], BODY, connections * n, seconds))
    requests = result["rps"] * seconds
    result["cpu_s"] = cores * (time.perf_counter() - started)
    result["cpu_ms_per_request"] = result["cpu_s"] * 1000 / requests if requests else float("nan")
    result["pss_mb"] = sum(pss_mb(s.proc.pid) for s in servers)
    result["device"], result["worker"] = answer.get("device"), answer.get("worker")
    return result


def pair(text: str) -> tuple[int, float]:
    n, _, t = text.partition("@")
    return int(n), float(t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="run", choices=["run", "save", "calibrate"],
                        help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--counts", default="1,2,4,8", help="sim device counts N")
    parser.add_argument("--times-ms", default="20,10,5", help="device time T of a request (ms)")
    parser.add_argument("--backends", default="jit,inference,auto")
    parser.add_argument("--per-device", default="8@20,4@10",
                        help="N@T pairs that also run as N processes with one device each ('' for none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--workers-per-device", type=int, default=2)
    parser.add_argument("--connections-per-device", type=int, default=2)
    args = parser.parse_args()
    if args.command == "save":
        return save_child(*args.rest)
    if args.command == "calibrate":
        prefix, backend, us, requests = args.rest
        return calibrate_child(prefix, backend, int(us), int(requests))

    began = time.monotonic()
    counts = [int(c) for c in args.counts.split(",")]
    times = [float(t) for t in args.times_ms.split(",")]
    backends = [b.strip() for b in args.backends.split(",")]
    pairs = [pair(p) for p in args.per_device.split(",") if p.strip()]
    pairs = [(n, t) for n, t in pairs if n in counts and t in times]
    workers, cpd = args.workers_per_device, args.connections_per_device
    print(f"{datetime.datetime.now().isoformat(timespec='seconds')}, {platform.platform()}, "
          f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "tiny" / "model"
        child("save", str(prefix))
        cal = calibrate(prefix, backends, times)
        print("\nCalibration (sim:0, the worker's path: move_to, forward, .numpy(); "
              "a request after warm-up):\n")
        print("| backend | runs as | transfers/request | bytes/request | T ms | PLACEENV_SIM_TRANSFER_US | "
              "check: device ms/request | check: wall ms/request |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for b in backends:
            c = cal[b]
            for t in times:
                k = c["check"][t]
                print(f"| {b} | {c['count']['resolved']} | {c['count']['transfers_per_request']:g} | "
                      f"{c['count']['bytes_per_request']:g} | {t:g} | {c['us'][t]} | "
                      f"{k['device_ms_per_request']:.2f} | {k['wall_ms_per_request']:.2f} |")
        print(flush=True)

        repos = {b: str(repository(Path(tmp), prefix, b)) for b in backends}
        runs = [(b, t, n, "one process") for n in counts for t in times for b in backends]
        runs += [(b, t, n, "per device") for n, t in pairs for b in backends]
        found: dict = {run: [] for run in runs}
        failures: list = []
        for r in range(args.rounds):
            for run in runs if r % 2 == 0 else runs[::-1]:
                b, t, n, mode = run
                us = cal[b]["us"][t]
                if mode == "one process":
                    settings = [dict(devices=[f"sim:{i}" for i in range(n)], model=MODEL, SIM_DEVICES=n,
                                     MODEL_REPOSITORY=repos[b], WORKERS_PER_DEVICE=workers,
                                     SIM_TRANSFER_US=us)]
                else:
                    settings = [dict(devices=["sim:0"], model=MODEL, SIM_DEVICES=1, MODEL_REPOSITORY=repos[b],
                                     WORKERS_PER_DEVICE=workers, SIM_TRANSFER_US=us) for _ in range(n)]
                try:
                    servers = start(settings)
                except Exception as exc:
                    failures.append({"run": list(run), "round": r + 1, "error": str(exc)[-2000:]})
                    print(f"round {r + 1}: {b} {t:g} ms {n} devices {mode}: FAILED TO START: "
                          f"{str(exc)[-800:]}", flush=True)
                    continue
                try:
                    got = measure(servers, n, cpd, args.seconds)
                except Exception as exc:
                    failures.append({"run": list(run), "round": r + 1, "error": str(exc)[-2000:]})
                    print(f"round {r + 1}: {b} {t:g} ms {n} devices {mode}: FAILED: {str(exc)[-800:]}",
                          flush=True)
                    continue
                finally:
                    for s in servers:
                        s.stop()
                found[run].append(got)
                print(f"round {r + 1}: {b:9} {t:4g} ms {n:2} devices {mode:11}: {got['rps']:6.0f} req/s "
                      f"({got['rps'] / (n * 1000 / t):4.0%} of ideal), p50 {got['p50_ms']:.1f} ms, "
                      f"CPU {got['cpu_ms_per_request']:.2f} ms/req, PSS {got['pss_mb']:.0f} MB, "
                      f"non-2xx {got['non_2xx']}, elapsed {(time.monotonic() - began) / 60:.1f} min",
                      flush=True)

    print(f"\n{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores; tiny Linear(64, 10), "
          f"batches of one; {args.rounds} rounds of {args.seconds:g} s, {workers} workers and wrk {cpd} "
          f"connections a device. "
          f"Ideal: N * 1000 / T. Host CPU: utime + stime of the service process trees during the wrk run, "
          f"over req/s * seconds.\n")

    def med(xs: list[dict], key: str) -> float:
        return statistics.median(x[key] for x in xs) if xs else float("nan")

    print("| backend | T ms | devices | mode | req/s median (min..max) | share of ideal | PSS MB | "
          "host CPU ms/req | p50 ms | non-2xx |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for b in backends:
        for t in times:
            for n in counts:
                for mode in ("one process", "per device"):
                    xs = found.get((b, t, n, mode))
                    if xs is None:
                        continue
                    if not xs:
                        print(f"| {b} | {t:g} | {n} | {mode} | failed | | | | | |")
                        continue
                    rps = [x["rps"] for x in xs]
                    ideal = n * 1000 / t
                    print(f"| {b} | {t:g} | {n} | {mode} | {statistics.median(rps):.0f} "
                          f"({min(rps):.0f}..{max(rps):.0f}) | {statistics.median(rps) / ideal:.0%} | "
                          f"{med(xs, 'pss_mb'):.0f} | "
                          f"{med(xs, 'cpu_ms_per_request'):.2f} | {med(xs, 'p50_ms'):.1f} | "
                          f"{sum(x['non_2xx'] for x in xs)} |")
    if pairs:
        def ratios(one: list[dict], per: list[dict], key: str) -> str:
            """The per-round ratio one / per device (the same round's runs): median (min..max)."""
            values = [a[key] / b[key] for a, b in zip(one, per)]
            return f"{statistics.median(values):.2f} ({min(values):.2f}..{max(values):.2f})"

        print("\n| backend | T ms | devices | one process req/s | per device req/s | "
              "one / per device req/s, per round | one process PSS MB | per device PSS MB | "
              "one / per device PSS, per round | host CPU ms/req one / per device |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for b in backends:
            for n, t in pairs:
                one, per = found[(b, t, n, "one process")], found[(b, t, n, "per device")]
                print(f"| {b} | {t:g} | {n} | {med(one, 'rps'):.0f} | {med(per, 'rps'):.0f} | "
                      f"{ratios(one, per, 'rps')} | {med(one, 'pss_mb'):.0f} | {med(per, 'pss_mb'):.0f} | "
                      f"{ratios(one, per, 'pss_mb')} | {med(one, 'cpu_ms_per_request'):.2f} / "
                      f"{med(per, 'cpu_ms_per_request'):.2f} |")
    if failures:
        print(f"\n{len(failures)} failed runs:")
        for f in failures:
            print(f"  round {f['round']} {f['run']}: {f['error'][-500:]}")
    machine = {"platform": platform.platform(), "cores": os.cpu_count()}
    path = save_results("device_time", args, machine=machine,
                        calibration={b: {"count": c["count"], "us": {f"{t:g}": u for t, u in c["us"].items()},
                                         "check": {f"{t:g}": k for t, k in c["check"].items()}}
                                     for b, c in cal.items()},
                        found=[{"backend": b, "T_ms": t, "devices": n, "mode": m, "rounds": xs}
                               for (b, t, n, m), xs in found.items()],
                        failures=failures, wall_minutes=(time.monotonic() - began) / 60)
    print(f"\nwall {(time.monotonic() - began) / 60:.1f} min; raw results: {path}")


if __name__ == "__main__":
    main()
