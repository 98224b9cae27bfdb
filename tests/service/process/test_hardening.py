"""Hardening: sustained overload, devices that fail at start-up, faults amid good traffic.

Real ``python -m placeenv.serve`` processes on 127.0.0.1 (sim devices), real HTTP clients.
Every load loop is bounded in request count and in time; the whole file stays
well under two minutes on a small, shared machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np
import support
from prometheus_client.utils import floatToGoString
from support import wait_until, wait_until_async
from support.servers import ServiceProcess

from placeenv.serve.metrics import LATENCY_BUCKETS

MiB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


async def _one(http: httpx.AsyncClient, content: bytes) -> tuple:
    """(status or exception name, client latency in s, headers, body, when it was sent by this process's
    ``perf_counter``)."""
    started = time.perf_counter()
    try:
        r = await http.post("/predict", content=content, headers={"content-type": "application/json"})
    except Exception as exc:  # noqa: BLE001 - any client-side failure is a finding, reported by the test
        return type(exc).__name__, time.perf_counter() - started, {}, str(exc), started
    return r.status_code, time.perf_counter() - started, dict(r.headers), r.text, started


async def closed_loop(url: str, content: bytes, clients: int, seconds: float, max_requests: int) -> tuple:
    """``clients`` back-to-back senders for ``seconds`` (at most ``max_requests``): (results, elapsed)."""
    results: list[tuple] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        start = time.perf_counter()

        async def client():
            while time.perf_counter() - start < seconds and len(results) < max_requests:
                results.append(await _one(http, content))

        await asyncio.gather(*[client() for _ in range(clients)])
        return results, time.perf_counter() - start


async def open_loop(url: str, content: bytes, rate: float, seconds: float) -> tuple:
    """Requests at a fixed ``rate`` per second for ``seconds``, whatever the answers: offered load.

    Each request is its own concurrent client. Returns
    (results, lag): lag is how late the last request left, i.e. whether this client kept pace.
    """
    count = int(rate * seconds)
    async with httpx.AsyncClient(
        base_url=url, timeout=30, limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)
    ) as http:
        loop = asyncio.get_running_loop()
        start, tasks = loop.time(), []
        for i in range(count):
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(http, content)))
        lag = loop.time() - (start + (count - 1) / rate)
        return await asyncio.gather(*tasks), lag


#: tests/, where ``support`` is: the child runs this file as a script.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(support.__file__)))


def open_loop_in_child(url: str, content: bytes, rate: float, seconds: float, on_tick) -> tuple:
    """``open_loop`` run by a fresh interpreter, so that nothing else in this test process (the
    threads and heap of earlier tests) stalls the client; ``on_tick`` runs here every 0.25 s."""
    # Answers go to files, not pipes: a child blocked on a full pipe would never exit.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            [sys.executable, __file__, url, str(rate), str(seconds)], stdin=subprocess.PIPE, stdout=out, stderr=err,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))},
        )
        child.stdin.write(content)
        child.stdin.close()
        wait_until(lambda: on_tick() or child.poll() is not None, seconds + 120,
                   "the load child did not finish", interval=0.25)
        out.seek(0)
        err.seek(0)
        assert child.returncode == 0, err.read().decode()[-3000:]
        found = json.load(out)
    return [tuple(r) for r in found["results"]], found["lag"]


def _mobilenet_body(seed: int = 0) -> bytes:
    image = np.random.default_rng(seed).uniform(-1, 1, (3, 32, 32)).round(4)
    return json.dumps({"model": "mobilenet", "inputs": [image.tolist()]}).encode()


def _sequential_latency(url: str, content: bytes, n: int) -> list[float]:
    latencies = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for _ in range(n):
            started = time.perf_counter()
            r = http.post("/predict", content=content, headers={"content-type": "application/json"})
            latencies.append(time.perf_counter() - started)
            assert r.status_code == 200, r.text
    return latencies


# ---------------------------------------------------------------------------------------------
# Overload at ~5x capacity (at most half what the front end reads)
# ---------------------------------------------------------------------------------------------

OVERLOAD_SECONDS = 10.0
TIMEOUT_S = 5.0
#: The service under overload: 2 devices, one worker each, one request a batch, 4 waiting per device.
WORKERS, QUEUE = 2, 4


def bucket_at_or_above(seconds: float) -> str:
    """The ``le`` label of the first latency bucket at or above ``seconds`` (``+Inf`` past the last)."""
    return next((floatToGoString(b) for b in LATENCY_BUCKETS if b >= seconds), "+Inf")


def bucket_holding(cumulative: dict[str, float], q: float) -> float:
    """The bound of the first latency bucket holding a fraction ``q`` of a histogram's observations
    (``cumulative``: its ``le`` labels to counts): an upper bound of their ``q`` quantile."""
    count = cumulative.get("+Inf", 0)
    return min((float(le) for le, n in cumulative.items() if n >= q * count and count), default=0.0)


def most_served_ahead(results: list[tuple], read_delay: float) -> int:
    """The most requests that one admitted request saw answered on its device while it waited: those
    sent before it and answered between its arrival and its own answer, by the client's clock. The
    device's queue is FIFO and holds at most ``QUEUE`` requests, its worker one more, one request a pass:
    at most ``QUEUE + 1`` are ahead of a request admitted. Its arrival is taken ``read_delay`` after it
    was sent (the longest the service took to read a request during the load, which its refusals show),
    so that what the device answered while the request waited unread is not counted. Requests sent after
    it are not counted either: the client reads answers that arrive together in any order (in CI a stalled
    client once read a burst of answers, among them those to requests behind one, and counted 9 ahead of
    a queue of 4). A count of passes, not a time: a pass's length drifts with the machine's
    other work (beside a busy loop the slowest admitted request took twice the median's time), the number
    of passes a queue holds does not. A service that admitted more than its queues hold answers more than
    these ahead of the requests it admitted last, and those were all sent before them."""
    done: dict[str, list[tuple[float, float]]] = {}
    admitted = []
    for status, latency, _, body, sent in results:
        if status == 200:
            device = json.loads(body)["device"]
            done.setdefault(device, []).append((sent, sent + latency))
            admitted.append((device, sent, sent + read_delay, sent + latency))
    return max((sum(other_sent < sent and arrived < t < answered for other_sent, t in done[device])
                for device, sent, arrived, answered in admitted),
               default=0)


def test_sustained_overload_sheds_load_and_recovers():
    proc = ServiceProcess(DEVICES="sim:0,sim:1", WORKERS_PER_DEVICE=1, QUEUE_CAPACITY=QUEUE,
                          MODELS="mobilenet", MAX_BATCH_SIZE=1, REQUEST_TIMEOUT_S=TIMEOUT_S)
    with proc:
        pid = proc.proc.pid
        content = _mobilenet_body()

        # Before: single-request latency (after a warm-up), then capacity with 4 clients -- enough
        # to keep both devices busy, never more than the queues hold, so nothing is refused.
        _sequential_latency(proc.url, content, 3)
        single_before = statistics.median(_sequential_latency(proc.url, content, 5))
        measured, elapsed = asyncio.run(
            closed_loop(proc.url, content, clients=4, seconds=3.0, max_requests=400)
        )
        assert {r[0] for r in measured} == {200}, {r[0] for r in measured}
        capacity = len(measured) / elapsed  # requests per second
        # What the front end answers while the workers are busy, as they are under the overload: the
        # same 26 KB bodies for a model it does not serve, read, parsed and refused (404) at once, beside
        # 4 clients keeping both devices busy. The workers' passes take the cores (and the GIL) from the
        # event loop, so this rate, not the idle loop's, is what the loop reads during the overload: in
        # CI the idle loop's 210/s halved still saturated it, and requests waited unread for seconds.
        unknown = content.replace(b'"mobilenet"', b'"no-such-model"', 1)

        async def refusing_beside_work():
            return await asyncio.gather(
                closed_loop(proc.url, unknown, clients=4, seconds=3.0, max_requests=3000),
                closed_loop(proc.url, content, clients=4, seconds=3.0, max_requests=400),
            )

        (refused, refused_elapsed), (beside, _) = asyncio.run(refusing_beside_work())
        assert {r[0] for r in refused} == {404}, {r[0] for r in refused}
        assert {r[0] for r in beside} == {200}, {r[0] for r in beside}
        measured += beside
        front_rate = len(refused) / refused_elapsed
        # ~5x what it can serve, and at most half what the front end reads beside busy workers: this
        # client (httpx, ~1 ms of CPU a request) and the service's event loop share the cores with the
        # workers, and past what the loop reads, they, not the service's queues, set the latency the
        # client sees (requests wait unread in socket buffers). Both figures are this machine's, now.
        rate = min(5 * capacity, front_rate / 2)

        rss_before = rss_bytes(pid)
        rss_samples: list[tuple[float, int]] = []
        t0 = time.perf_counter()
        results, lag = open_loop_in_child(
            proc.url, content, rate, OVERLOAD_SECONDS,
            on_tick=lambda: rss_samples.append((time.perf_counter() - t0, rss_bytes(pid))),
        )
        rss_samples.append((time.perf_counter() - t0, rss_bytes(pid)))
        load_ended = time.perf_counter()
        served_rate = sum(1 for r in results if r[0] == 200) / OVERLOAD_SECONDS

        # After: ready again within a few seconds, queues empty, nothing in flight.
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            seen = {}

            def recovered() -> bool:
                seen.update(ready=http.get("/readyz").status_code == 200,
                            depth=proc.total("inference_queue_depth"),
                            in_flight=proc.total("inference_in_flight_requests"))
                return seen["ready"] and seen["depth"] == 0 and seen["in_flight"] == 0

            # Every request was answered before the load ended; what is left is the counters, and 5 s
            # covers their reads on a busy machine.
            wait_until(recovered, max(0.0, 5.0 - (time.perf_counter() - load_ended)),
                       lambda: f"{seen} {proc.output()[-6000:]}", interval=0.1)
        recovered_in = time.perf_counter() - load_ended
        # As fast as before the overload (same machine, same request): a median of 5, taken again until
        # it is, within a deadline. Once is not enough on a shared machine: in CI, beside a busy loop and
        # the other xdist worker, one median landed in another process's burst (646 ms against 104);
        # a service that stays slow still fails.
        afters: list[float] = []

        def fast_again() -> bool:
            afters.append(statistics.median(_sequential_latency(proc.url, content, 5)))
            return afters[-1] < 3 * single_before + 0.2

        wait_until(fast_again, 30, lambda: f"single {single_before * 1000:.0f} ms before, medians after: "
                   f"{[round(a * 1000) for a in afters]} ms", interval=0.5)
        single_after = afters[-1]
        served = proc.total("inference_requests_total", status="ok")
        overloaded = proc.total("inference_requests_total", status="overloaded")
        others = {
            status: proc.total("inference_requests_total", status=status)
            for status in ("timeout", "error", "invalid", "draining", "not_found", "not_ready")
        }
        others["not_found"] -= len(refused)  # the front end's own measurement
        rss_after = rss_bytes(pid)
        refusal_buckets = proc.by_label("inference_refusal_duration_seconds_bucket", "le", status="overloaded")

    statuses = [r[0] for r in results]
    ok = [r for r in results if r[0] == 200]
    shed = [r for r in results if r[0] in (503, 429)]
    accepted_p99 = percentile([r[1] for r in ok], 99)
    shed_p50, shed_p99 = percentile([r[1] for r in shed], 50), percentile([r[1] for r in shed], 99)
    # The refusals by the service's clock (arrival to answer): the bucket bounds their median and tail lie in.
    refusals_timed = refusal_buckets.get("+Inf", 0)
    refusal_p50, refusal_p99 = (bucket_holding(refusal_buckets, q) for q in (0.5, 0.99))
    peak = max(s for _, s in rss_samples)
    # How long the service took to read a request during the load: the slowest refusal, sent to answered.
    read_delay = max(r[1] for r in shed) if shed else 0.0
    ahead = most_served_ahead(results, read_delay)
    report = (
        f"capacity {capacity:.1f}/s, front end beside busy workers {front_rate:.0f}/s, "
        f"served under the load {served_rate:.1f}/s, "
        f"offered {rate:.1f}/s for {OVERLOAD_SECONDS:g}s: "
        f"{len(results)} requests, {len(ok)} ok, {len(shed)} shed; "
        f"accepted p50 {percentile([r[1] for r in ok], 50) * 1000:.0f} p99 {accepted_p99 * 1000:.0f} ms; "
        f"shed p50 {shed_p50 * 1000:.0f} p99 {shed_p99 * 1000:.0f} ms (service's clock: {refusals_timed:g} timed, "
        f"p50 <= {refusal_p50 * 1000:g} p99 <= {refusal_p99 * 1000:g} ms); client lag {lag:.2f}s; "
        f"single {single_before * 1000:.0f} -> {single_after * 1000:.0f} ms (try {len(afters)}); "
        f"RSS {rss_before / MiB:.0f} -> max {peak / MiB:.0f} -> {rss_after / MiB:.0f} MiB; "
        f"recovered in {recovered_in:.2f}s; most answered on an admitted request's device while it waited "
        f"(from {read_delay * 1000:.0f} ms after it was sent): {ahead} (queue {QUEUE})"
    )
    print(report)

    # The load was really offered at that rate: the last request left at most a fifth of the load's span
    # late, so the offered rate was at least 5/6 of its target.
    assert lag < OVERLOAD_SECONDS / 5, report
    # Every request exactly one HTTP answer, and only "served" or "come back later".
    assert len(results) == int(rate * OVERLOAD_SECONDS)
    assert set(statuses) <= {200, 503, 429}, (
        {s: statuses.count(s) for s in set(statuses)},
        [r for r in results if r[0] not in (200, 503, 429)][:3],
        report,
    )
    assert ok and shed, report  # it served and it shed: the overload was real
    for status, _, headers, body, _ in shed:
        assert headers.get("retry-after") == "1", (status, dict(headers), body)
        assert json.loads(body)["detail"]
    # The service counted each answer once: the overload's, plus the before/after singles and capacity run.
    assert served == len(ok) + len(measured) + 3 + 5 + 5 * len(afters), report
    assert overloaded == len(shed), report
    assert not any(others.values()), others

    # Queues bound the wait: no admitted request waited for more passes than its device's queue and
    # worker hold (one more where an answer ahead of it reached the client after its arrival). By the
    # client's clock it also waited to be read, as a refused request does: the refusals' tail is that
    # wait on this machine, and the request timeout bounds the rest.
    assert ahead <= QUEUE + 2, report
    assert accepted_p99 < shed_p99 + TIMEOUT_S, report
    # Refusals come at once, without waiting in a queue, by the service's clock: the client's also counts
    # the wait to be read, which is the machine's (in CI, beside another test's burst, refusals waited
    # 6 s unread while the service's queues held 8). The median within what "fast again" allows one
    # request alone (below), from the single latency measured before the load; a refusal that queued
    # would wait for passes. The tail short of the request timeout, which a queued refusal would reach.
    assert refusals_timed == len(shed), report
    assert refusal_p50 <= float(bucket_at_or_above(3 * single_before + 0.2)), report
    assert refusal_p99 < TIMEOUT_S, report

    # Memory: bounded growth, and not still climbing at the end of the overload.
    assert peak - rss_before < 300 * MiB, report
    half = [s for t, s in rss_samples if t >= OVERLOAD_SECONDS / 2]
    assert half and half[-1] - half[0] < 100 * MiB, report

    # Recovered: as fast as before the overload (same machine, same request).
    assert single_after < 3 * single_before + 0.2, report


# ---------------------------------------------------------------------------------------------
# A device that cannot start
# ---------------------------------------------------------------------------------------------


def test_unusable_device_at_startup_fails_fast_by_default():
    proc = ServiceProcess(DEVICES="sim:0,sim:9")
    try:
        def exited() -> bool:  # never ready while it lives
            if proc.proc.poll() is not None:
                return True
            try:
                assert httpx.get(proc.url + "/readyz", timeout=2).status_code != 200, "became ready"
            except httpx.HTTPError:
                pass
            return False

        wait_until(exited, 120, "the service neither exited nor became ready", interval=0.2)
        code = proc.proc.wait(10)
        output = proc.output()
    finally:
        proc.kill()
    assert code != 0, output[-3000:]
    assert "sim:9" in output, output[-3000:]
    assert "available devices: cpu, sim:0, sim:1, sim:2, sim:3" in output, output[-3000:]
    assert "cannot be used" in output, output[-3000:]


def test_unusable_device_is_skipped_when_asked():
    with ServiceProcess(DEVICES="sim:0,sim:9", ON_DEVICE_FAILURE="skip") as proc:
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            assert http.get("/v1/models").json()["devices"] == ["sim:0"]
            ready = http.get("/readyz").json()
            assert ready["ready"] and set(ready["workers"]) == {"sim:0/0", "sim:0/1"}
            r = http.post("/predict", json={"model": "digits", "inputs": [[0] * 64, [16] * 64]})
            assert r.status_code == 200, r.text
            assert r.json()["device"] == "sim:0" and len(r.json()["outputs"]) == 2
        assert proc.total("worker_up") == 2
    text = proc.output()[-20000:]
    assert "skipping device 'sim:9'" in text and "available devices: cpu, sim:0" in text, text


# ---------------------------------------------------------------------------------------------
# Faults amid good traffic
# ---------------------------------------------------------------------------------------------


def test_model_faults_and_a_killed_worker_do_not_touch_other_requests():
    rng = np.random.default_rng(0)
    digits = [rng.integers(0, 17, 64).tolist() for _ in range(32)]

    with ServiceProcess(MODELS="digits,faulty") as proc:
        restarts_before = proc.total("worker_restarts_total")

        good_answered: list[int] = []

        async def main():
            async with httpx.AsyncClient(base_url=proc.url, timeout=60) as http:
                async def send(kind: str, inputs):
                    try:
                        model = "digits" if kind == "good" else "faulty"
                        r = await http.post("/predict", json={"model": model, "inputs": inputs})
                        return kind, r.status_code, r.text
                    except Exception as exc:  # noqa: BLE001
                        return kind, type(exc).__name__, str(exc)

                async def good_client(c: int):
                    answers = []
                    for i in range(25):
                        answers.append(await send("good", [digits[(c * 7 + i) % 32]]))
                        good_answered.append(1)
                    return answers

                async def raising_client(c: int):
                    out = []
                    for i in range(10):
                        out.append(await send("raise", [[-1.0, 0.25 * (i % 4), 0, c / 8]]))
                        # Spread among the good traffic: the next fault once a good request has been
                        # answered since this one (or all of them have).
                        async def good_since(seen: int = len(good_answered)) -> bool:
                            return len(good_answered) > seen or len(good_answered) == 8 * 25

                        await wait_until_async(good_since, 60, "the good traffic stopped", interval=0.005)
                    return out

                async def killer():
                    # In the middle of the traffic: a quarter of the good requests answered, most to come.
                    async def going() -> bool:
                        return len(good_answered) >= 50

                    await wait_until_async(going, 60, "the good traffic did not get going", interval=0.005)
                    return [await send("kill", [[-2.0, 0, 0, 0]])]

                batches = await asyncio.gather(
                    *[good_client(c) for c in range(8)], *[raising_client(c) for c in range(3)], killer()
                )
                return [r for batch in batches for r in batch]

        results = asyncio.run(main())

        # The dead worker is replaced, and the service is ready again.
        def recovered() -> bool:
            nonlocal restarts
            restarts = proc.total("worker_restarts_total") - restarts_before
            return restarts >= 1 and httpx.get(proc.url + "/readyz", timeout=10).status_code == 200

        restarts = 0.0
        wait_until(recovered, 60, lambda: f"not recovered: {restarts} restarts {proc.output()[-6000:]}",
                   interval=0.2)
        after = [httpx.post(proc.url + "/predict", json={"model": "digits", "inputs": [d]}, timeout=30)
                 for d in digits[:8]]
        workers_up = proc.total("worker_up")
        errors = proc.total("inference_requests_total", status="error")
        ok = proc.total("inference_requests_total", status="ok")

    kinds = {kind: [r for r in results if r[0] == kind] for kind in ("good", "raise", "kill")}
    assert [len(kinds[k]) for k in ("good", "raise", "kill")] == [200, 30, 1]  # one answer each
    bad_good = [r for r in kinds["good"] if r[1] != 200]
    assert not bad_good, bad_good[:5]
    assert all(r[1] == 500 and "failed on this request" in r[2] for r in kinds["raise"]), kinds["raise"]
    # A raising request shares a forward pass only with other faulty requests; if the killer
    # was one of them, it died with the worker. Otherwise it is the model's own error.
    assert all("injected model failure" in r[2] or "died" in r[2] for r in kinds["raise"])
    (kill,) = kinds["kill"]
    assert kill[1] == 500 and "died" in kill[2], kill
    assert restarts == 1
    assert all(r.status_code == 200 for r in after)
    assert workers_up == 8
    assert errors == 31 and ok == 200 + 8


if __name__ == "__main__":  # open_loop_in_child: URL RATE SECONDS, the body on stdin
    found, late = asyncio.run(open_loop(sys.argv[1], sys.stdin.buffer.read(), float(sys.argv[2]), float(sys.argv[3])))
    json.dump({"results": found, "lag": late}, sys.stdout)
