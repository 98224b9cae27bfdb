"""Several replicas behind a real load balancer: what `docker compose --profile scale` and a
Kubernetes Deployment do, proved here with processes instead of containers.

Three service processes on 2 sim devices each, Debian's nginx running the shipped
``deploy/nginx/placeenv.conf`` in front of them, a real Prometheus discovering them through
file-based service discovery, and Locust through nginx with its leak gate reading every
replica's counters from Prometheus (counters that begin again at every restart). Then:
a rolling restart under load loses no request; a replica killed with SIGKILL costs at
most a bounded number of client errors, and nginx routes around it until it returns;
and with isolation off on one replica, the same gate fails (the negative control).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.dashboards import dashboard_exprs
from support import wait_until
from support.servers import Nginx, Prometheus, ReplicaSet
from support.tools import need_tool

ROOT = Path(__file__).resolve().parents[2]
LOCUST = str(Path(sys.executable).with_name("locust"))
REPLICAS = 3
#: Each replica: 2 sim devices, one worker each (three replicas share the machine's two cores),
#: both bundled models (Locust's traffic uses both), a short shutdown delay, and an engine with
#: one front-end process (the supervisor's drain and restarts behind nginx).
SETTINGS = {"DEVICES": "sim:0,sim:1", "WORKERS_PER_DEVICE": 1, "MODELS": "digits,mobilenet",
            "SHUTDOWN_DELAY_S": 1.0, "FRONTENDS": 1}
#: Client-visible errors allowed when one replica is killed with SIGKILL under load.
#: nginx retries a request whose connection broke (`proxy_next_upstream error non_idempotent`),
#: so none is expected; the bound leaves room for one per Locust user in flight on the replica.
KILL_ERRORS_BOUND = 8
#: Locust's -t: only an outer bound on a scenario's load (each ends it with SIGTERM once done).
LOAD_BOUND_S = 600
#: Locust's --wait-s: each user waits up to this long between requests. The scenarios are about what
#: happens under load over time (restarts, a kill, a leak), not how much load: 8 users at full speed took
#: the replicas as much CPU as the machine gave them for as long as the scenarios waited.
WAIT_S = 0.25
#: Requests every device serves in the steady run: enough that each replica's share is load, not luck.
STEADY_PER_DEVICE = 40
#: How long a scenario step may take: what nginx and a replica need, on a machine several times slower.
STEP_S = 120


@pytest.fixture(scope="module", autouse=True)
def tools():
    """Debian's nginx and prometheus, before anything of the module starts."""
    need_tool("nginx")
    need_tool("prometheus")


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.replicas = ReplicaSet(REPLICAS, **SETTINGS)
        self.prometheus = self.nginx = None
        try:
            self.prometheus = Prometheus(tmp)
            self.prometheus.set_targets(self.replicas.ports)
            self.replicas.start_all()
            self.nginx = Nginx(tmp, self.replicas.ports)
        except BaseException:
            self.close()
            raise

    def instance(self, i: int) -> str:
        return f"127.0.0.1:{self.replicas.ports[i]}"

    def locust(self, name: str, scenario, max_failure_ratio: float = 0.0,
               nginx: Nginx | None = None) -> tuple[int, str]:
        """Locust through nginx while ``scenario()`` runs, then SIGTERM; (exit code, output).

        The load lasts as long as the scenario takes on this machine: every scenario waits for
        what it needs to see (the load reaching each replica, a replica back and served), so
        nothing here is a wall-clock budget that a slower machine misses. Locust's own ``-t``
        is only the outer bound, for a scenario that hangs past its own deadlines.
        """
        csv = self.tmp / name
        proc = subprocess.Popen(
            [LOCUST, "-f", "loadtest/", "--host", (nginx or self.nginx).url, "-u", "8", "-r", "8",
             "-t", f"{LOAD_BOUND_S}s", "--csv", str(csv), "--html", f"{csv}.html",
             "--prometheus", self.prometheus.url, "--prometheus-settle-s", "2.5",
             "--max-failure-ratio", str(max_failure_ratio), "--wait-s", str(WAIT_S)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            scenario()
            ended = time.time()
            # Prometheus, where the gate reads the run, has scraped every replica since the scenario
            # ended (a busy replica's scrape can fail or come late).
            wait_until(lambda: self.prometheus.scraped_since(ended), STEP_S,
                       "Prometheus did not scrape every replica after the scenario", interval=0.2)
            assert proc.poll() is None, "the load ended before the scenario did"
            proc.send_signal(signal.SIGTERM)  # Locust's gate stops the users and reads the run
            output, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert "Got SIGTERM signal" in output, output[-3000:]
        return proc.returncode, output

    def close(self) -> None:
        for part in (self.nginx, self.prometheus):
            if part is not None:
                part.stop()
        self.replicas.stop_all()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("replicas"))
    yield stack
    stack.close()


def gate(output: str) -> dict:
    """The leak gate's summary, parsed."""
    assert "leak gate:" in output, output[-3000:]
    requests, failures = map(int, re.search(r"requests (\d+), failures (\d+)", output).groups())
    served = dict(re.findall(r"(127\.0\.0\.1:\d+ sim:\d)=(\d+)", re.search(r"served per device: (.*)", output)[1]))
    leaks = int(re.search(r"device leaks (\d+)", output)[1])
    return {"pass": "leak gate: PASS" in output, "requests": requests, "failures": failures,
            "served": {k: int(v) for k, v in served.items()}, "leaks": leaks}


def every_device(stack: Stack) -> set[str]:
    return {f"{stack.instance(i)} sim:{d}" for i in range(REPLICAS) for d in (0, 1)}


def served(stack: Stack, i: int, **labels) -> float:
    """Requests replica ``i`` (as it runs now) has answered, on ``labels``' device if given."""
    return stack.replicas.procs[i].total("inference_requests_total", status="ok", **labels)


def every_device_served(stack: Stack, at_least: int, replicas: range = range(REPLICAS)) -> None:
    """Until each device of each of ``replicas`` (as it runs now) has answered ``at_least`` requests."""
    def counts() -> dict[str, float]:
        return {f"{i} sim:{d}": served(stack, i, device=f"sim:{d}") for i in replicas for d in (0, 1)}
    wait_until(lambda: min(counts().values()) >= at_least, STEP_S,
               lambda: f"not every device served {at_least} requests: {counts()}", interval=0.2)


def load_reaches_every_replica(stack: Stack) -> None:
    """Until each replica has answered requests through nginx: the load is under way everywhere."""
    wait_until(lambda: all(served(stack, i) > 0 for i in range(REPLICAS)), STEP_S,
               lambda: f"the load did not reach every replica: {[served(stack, i) for i in range(REPLICAS)]}",
               interval=0.2)


def roll(stack: Stack, exits: list[int], replicas: range = range(REPLICAS)) -> None:
    """SIGTERM each of ``replicas`` in turn, start it again and wait until it is ready and nginx
    sends it requests again (it probes a returned replica after fail_timeout, 2 s). The load runs
    until the last replica is back and served (a roll took ~30 s alone, ~40 s in a busy CI run, and
    more on a slower machine)."""
    load_reaches_every_replica(stack)
    for i in replicas:
        exits.append(stack.replicas.terminate(i))
        stack.replicas.start(i).wait_ready()
        # The gate counts a device that served nothing in the run as a fault, and paced users reach a replica
        # that is back a few at a time: each of its devices serves before the next one goes.
        every_device_served(stack, 1, range(i, i + 1))


def per_replica_panels_draw_every_replica(stack: Stack) -> None:
    """Until the dashboard's per-replica panels draw one line per replica (Prometheus has scraped each
    replica under load)."""
    per_replica = [expr for expr in dashboard_exprs() if "by (instance" in expr]
    assert len(per_replica) == 4
    every = {stack.instance(i) for i in range(REPLICAS)}

    def drawn(expr: str) -> set[str]:
        return {sample["metric"]["instance"] for sample in stack.prometheus.query(expr)}

    for expr in per_replica:
        wait_until(lambda: drawn(expr) == every, STEP_S, lambda: f"{expr} draws {sorted(drawn(expr))}", interval=0.5)


def test_every_device_serves_with_no_leak_and_a_rolling_restart_under_load_loses_no_request(stack):
    """One run of load through nginx: first steady, until every device of every replica has served
    ``STEADY_PER_DEVICE`` requests (each replica's share is load, not luck) and the dashboard draws each
    replica; then each replica in turn drained, stopped and started again. No request fails, no device
    leaks, and the gate, reading every replica through Prometheus, passes."""
    exits = []
    errors_before = len(stack.nginx.errors())

    def steady_then_roll() -> None:
        every_device_served(stack, STEADY_PER_DEVICE)
        per_replica_panels_draw_every_replica(stack)
        roll(stack, exits)

    code, output = stack.locust("rolling", steady_then_roll)
    result = gate(output)
    print(f"steady, then a rolling restart: {result['requests']} requests, {result['failures']} failures")
    assert exits == [0] * REPLICAS
    assert result["failures"] == 0 and result["leaks"] == 0 and code == 0 and result["pass"], output[-3000:]
    assert set(result["served"]) == every_device(stack) and all(n > 0 for n in result["served"].values())
    # Each replica drained and stopped after serving (its log's last word).
    for log in stack.replicas.logs[-REPLICAS:]:
        stopped = re.search(r"stopped: (\d+) inference requests received", log)
        assert stopped and int(stopped[1]) > 0, log[-2000:]
    # The restarts happened under traffic: nginx found replicas gone and retried elsewhere.
    assert "Connection refused" in stack.nginx.errors()[errors_before:]


def test_rolling_restart_without_retries_loses_requests(stack):
    """The control: the same restart behind the shipped nginx with `proxy_next_upstream off`. One
    replica's is enough to lose requests (each restart loses some; the roll above has three)."""
    plain = Nginx(stack.tmp / "no-retries", stack.replicas.ports, retries=False)
    try:
        _, output = stack.locust("no-retries", lambda: roll(stack, [], range(1)), max_failure_ratio=1.0,
                                 nginx=plain)
    finally:
        plain.stop()
    result = gate(output)
    print(f"rolling restart without retries: {result['requests']} requests, {result['failures']} failures")
    assert result["failures"] > 0, output[-3000:]
    assert result["leaks"] == 0


def test_sigkill_costs_a_bounded_number_of_errors_and_nginx_routes_around(stack):
    victim = 1

    def kill_and_return():
        load_reaches_every_replica(stack)
        errors_before = len(stack.nginx.errors())
        others = [i for i in range(REPLICAS) if i != victim]
        before = sum(served(stack, i) for i in others)
        stack.replicas.kill(victim)
        # Load goes on without it: nginx found it gone, and the others served a round of requests more.
        wait_until(lambda: stack.instance(victim) in stack.nginx.errors()[errors_before:]
                   and sum(served(stack, i) for i in others) >= before + 8 * 8, STEP_S,
                   "nginx did not route around the killed replica", interval=0.2)
        stack.replicas.start(victim).wait_ready()
        every_device_served(stack, 1, range(victim, victim + 1))  # (as after each restart of the roll)

    code, output = stack.locust("sigkill", kill_and_return, max_failure_ratio=1.0)
    result = gate(output)
    print(f"sigkill: {result['requests']} requests, {result['failures']} failures")
    assert result["failures"] <= KILL_ERRORS_BOUND and code == 0, output[-3000:]
    assert result["leaks"] == 0


def test_the_gate_fails_when_one_replica_leaks(stack):
    """The negative control: the same gate, with isolation off on one replica."""
    leaky = 2
    stack.replicas.terminate(leaky)
    stack.replicas.start(leaky, ISOLATION="off").wait_ready()

    def leaks() -> float:
        return stack.replicas.procs[leaky].total("placeenv_device_leaks_total")

    # The gate reads what grew during the run, and the replica may count leaks before it (its
    # start-up's own tensors): the load goes on until the count grew under it.
    before = leaks()

    def leaks_seen() -> None:  # every replica serves, and the leaky one counts more leaks
        load_reaches_every_replica(stack)
        wait_until(lambda: leaks() > before, STEP_S, "the replica with isolation off counted no leak under load",
                   interval=0.2)

    # The module's last test: the replica stays as it is until the stack closes.
    code, output = stack.locust("leaky", leaks_seen, max_failure_ratio=1.0)
    result = gate(output)
    assert code != 0 and not result["pass"], output[-3000:]
    assert result["leaks"] > 0
    # The leaks are the leaky replica's, found through Prometheus.
    leaking = {s["metric"]["instance"] for s in stack.prometheus.query("placeenv_device_leaks_total > 0")}
    assert leaking == {stack.instance(leaky)}
