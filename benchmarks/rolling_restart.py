"""What clients see while replicas behind nginx restart, with and without the drain settings.

    python benchmarks/rolling_restart.py [--rounds 3] [--seconds 30] [--replicas 3]

Needs Debian's ``nginx`` and ``prometheus``. The set-up of ``tests/e2e/test_replicas.py``: replicas
on 2 sim devices each, nginx running the shipped ``deploy/nginx/placeenv.conf``, Locust (8
users) through nginx, its leak gate reading Prometheus. Each round runs every scenario, in a
rotated order, on a fresh set of replicas:

  rolling  SIGTERM each replica in turn, start it again, wait for /readyz, pause 2 s
  kill     SIGKILL one replica, leave it dead 6 s, start it again

under the shipped settings (PLACEENV_SHUTDOWN_DELAY_S=1 and nginx retrying
``error non_idempotent``), with the delay at 0, with nginx's retries off
(``proxy_next_upstream off``), and with both. Prints a Markdown table of client-visible
failures per run (median, min..max over rounds) and writes ``results/rolling_restart.json``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import save_results  # noqa: E402
from support.servers import Nginx, Prometheus, ReplicaSet  # noqa: E402

LOCUST = str(Path(sys.executable).with_name("locust"))
SCENARIOS = {  # name: (shutdown delay, nginx retries)
    "shipped (delay 1 s, retries)": (1.0, True),
    "delay 0, retries": (0.0, True),
    "delay 1 s, no retries": (1.0, False),
    "delay 0, no retries": (0.0, False),
}


def run(tmp: Path, events: str, delay: float, retries: bool, replicas: int, seconds: int) -> dict:
    prometheus = Prometheus(tmp)
    group = ReplicaSet(replicas, DEVICES="sim:0,sim:1", WORKERS_PER_DEVICE=1, MODELS="digits,mobilenet",
                       SHUTDOWN_DELAY_S=delay)
    nginx = None
    try:
        prometheus.set_targets(group.ports)
        group.start_all()
        nginx = Nginx(tmp, group.ports, retries=retries)
        locust = subprocess.Popen(
            [LOCUST, "-f", "loadtest/", "--host", nginx.url, "-u", "8", "-r", "8", "-t", f"{seconds}s",
             "--csv", str(tmp / "locust"), "--html", str(tmp / "locust.html"), "--prometheus", prometheus.url,
             "--prometheus-settle-s", "2.5", "--max-failure-ratio", "1"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        time.sleep(3)
        if events == "rolling":
            for i in range(replicas):
                group.terminate(i)
                group.start(i).wait_ready()
                time.sleep(2)
        else:
            group.kill(1)
            time.sleep(6)
            group.start(1).wait_ready()
        output, _ = locust.communicate(timeout=seconds + 120)
        requests, failures = map(int, re.search(r"requests (\d+), failures (\d+)", output).groups())
        leaks = int(re.search(r"device leaks (\d+)", output)[1])
        with open(tmp / "locust_failures.csv", newline="") as f:  # what the failures were
            kinds: dict[str, int] = {}
            for row in csv.DictReader(f):
                status = re.search(r"\b(5\d\d)\b", row["Error"])
                key = status[1] if status else row["Error"][:40]
                kinds[key] = kinds.get(key, 0) + int(row["Occurrences"])
        return {"requests": requests, "failures": failures, "leaks": leaks, "errors": kinds}
    finally:
        if nginx is not None:
            nginx.stop()
        group.stop_all()
        prometheus.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args()
    names = list(SCENARIOS)
    results: dict[str, dict[str, list[dict]]] = {e: {n: [] for n in names} for e in ("rolling", "kill")}
    for r in range(args.rounds):
        for events in ("rolling", "kill"):
            for name in names[r % len(names):] + names[:r % len(names)]:
                with tempfile.TemporaryDirectory() as tmp:
                    got = run(Path(tmp), events, *SCENARIOS[name], args.replicas, args.seconds)
                print(f"round {r + 1} {events:7} {name:30} {got}", flush=True)
                results[events][name].append(got)

    print(f"\n{datetime.date.today()}, {platform.machine()}, {args.rounds} rounds, {args.replicas} replicas x 2 sim "
          f"devices, Locust 8 users for {args.seconds} s through nginx\n")
    print("| events | settings | requests | client-visible failures, median (min..max) | leaks |")
    print("|---|---|---:|---:|---:|")
    for events, by_name in results.items():
        for name, runs in by_name.items():
            failures = [x["failures"] for x in runs]
            print(f"| {events} | {name} | {statistics.median(x['requests'] for x in runs):.0f} | "
                  f"{statistics.median(failures):.0f} ({min(failures)}..{max(failures)}) | "
                  f"{sum(x['leaks'] for x in runs)} |")
    save_results("rolling_restart", args, results=results)


if __name__ == "__main__":
    main()
