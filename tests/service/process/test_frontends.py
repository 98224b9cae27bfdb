"""Front ends in their own processes (``--frontends K``): one engine, K front ends, one supervisor.

Real processes throughout: the supervisor, the engine and the front ends it starts, clients over
HTTP and gRPC. What the single process promises holds across them: readiness only when every
process is ready; SIGTERM stops it (accepted requests answered, exit 0); a front end killed with
SIGKILL is replaced while the others serve; an engine killed with SIGKILL has its requests in
flight answered with 503 at once and is replaced, or ends the service with ``--restart never``.
Each fault test has its negative control: what the same check sees without the behaviour.
"""

from __future__ import annotations

import contextlib
import os
import socket
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from support import wait_until
from support.servers import ServiceProcess, free_port, workers_held

from placeenv.serve.process import runtime
from placeenv.serve.process.link import SWEEP_S

DIGITS = np.arange(3 * 64, dtype=np.float32).reshape(3, 64) % 17
SETTINGS = {"FRONTENDS": 2, "DEVICES": "sim:0,sim:1", "WORKERS_PER_DEVICE": 1, "MODELS": "digits,gate"}


def children(supervisor: int) -> dict[str, list[int]]:
    """The supervisor's child processes by role: {"engine": [pid], "frontend": [pid, pid]}."""
    found: dict[str, list[int]] = {"engine": [], "frontend": []}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == supervisor:
            for role in found:
                if f"placeenv.serve.process.{role}_main".encode() in command:
                    found[role].append(int(entry.name))
    return found


def maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def predict(url: str, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{url}/predict", json={"model": "digits", "inputs": DIGITS[:1].tolist()}, timeout=timeout)


@pytest.fixture(scope="module")
def service_settings():
    return {"GRPC_PORT": free_port(), **SETTINGS}


def test_the_supervisor_starts_one_engine_and_k_front_ends_and_only_the_engine_has_paddle(service):
    roles = children(service.proc.pid)
    assert len(roles["engine"]) == 1 and len(roles["frontend"]) == 2, roles
    # The front ends parse and answer without Paddle; the engine's map is the control that the
    # check sees Paddle where it is loaded.
    assert "libpaddle" in maps(roles["engine"][0])
    for pid in roles["frontend"]:
        assert "libpaddle" not in maps(pid)
    assert "libpaddle" not in maps(service.proc.pid)


def test_triton_clients_over_http_and_grpc(service, service_settings):
    for client, module in ((th.InferenceServerClient(service.url.removeprefix("http://")), th),
                           (tg.InferenceServerClient(f"127.0.0.1:{service_settings['GRPC_PORT']}"), tg)):
        # Closed here: the HTTP client's pool is gevent's, and a close left to the garbage collector runs in
        # whatever thread collects it, which may have no gevent hub (an exception in __del__).
        with client:
            assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("digits")
            assert client.get_model_metadata("digits") is not None
            pixels = module.InferInput("pixels", list(DIGITS.shape), "FP32")
            pixels.set_data_from_numpy(DIGITS)
            result = client.infer("digits", [pixels])
            assert result.as_numpy("label").shape == (3,)
            assert result.as_numpy("probabilities").shape == (3, 10)


def test_many_concurrent_requests_are_each_answered_with_their_own_rows(service):
    def one(i: int) -> tuple[int, list]:
        rows = (DIGITS + i) % 17
        answer = httpx.post(f"{service.url}/v2/models/digits/infer", timeout=60, json={"inputs": [
            {"name": "pixels", "shape": [3, 64], "datatype": "FP32", "data": rows.ravel().tolist()}]})
        assert answer.status_code == 200, answer.text
        return i, next(o["data"] for o in answer.json()["outputs"] if o["name"] == "label")

    with ThreadPoolExecutor(16) as pool:
        answers = dict(pool.map(one, range(64)))
    with ThreadPoolExecutor(16) as pool:  # the same rows again, one request each: the same labels
        again = dict(pool.map(one, range(64)))
    assert answers == again


def test_bad_input_is_refused_by_the_front_end(service):
    answer = httpx.post(f"{service.url}/v2/models/digits/infer", timeout=10, json={"inputs": [
        {"name": "pixels", "shape": [1, 63], "datatype": "FP32", "data": [0] * 63}]})
    assert answer.status_code == 400 and "expected [-1, 64]" in answer.json()["error"]
    assert httpx.post(f"{service.url}/v2/models/nope/infer", json={"inputs": []}, timeout=10).status_code == 404


# -- faults and lifecycle: each its own service --------------------------------------------------


def test_sigterm_answers_every_accepted_request_and_exits_zero():
    with ServiceProcess(**SETTINGS, SHUTDOWN_DELAY_S=1.0) as proc, ThreadPoolExecutor(8) as pool:
        with workers_held(proc.url, 2) as held:  # both workers busy: what follows waits in the queues
            queued = [pool.submit(predict, proc.url, 60) for _ in range(8)]
            wait_until(lambda: proc.total("inference_queue_depth") >= 8, 30, "the requests were not queued")
            proc.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: httpx.get(proc.url + "/readyz", timeout=5).status_code == 503, 5,
                       "readiness still on after SIGTERM")
        assert [f.result().status_code for f in held] == [200, 200]
        assert [f.result().status_code for f in queued] == [200] * 8
        assert proc.proc.wait(60) == 0, proc.output()[-3000:]


def test_a_killed_front_end_is_replaced_while_the_other_serves():
    with ServiceProcess(**SETTINGS) as proc:
        before = children(proc.proc.pid)["frontend"]
        os.kill(before[0], signal.SIGKILL)
        # The other front end serves meanwhile: every request is answered (connections the kernel
        # gave the dead one are refused or reset, and the client retries them, as a browser would).
        answered = 0
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                answered += predict(proc.url).status_code == 200
            except httpx.TransportError:
                pass
        assert answered > 0
        wait_until(lambda: len(set(children(proc.proc.pid)["frontend"]) - set(before)) == 1, 30,
                   "the killed front end was not replaced")
        proc.wait_ready(60)
        assert predict(proc.url).status_code == 200
        assert before[1] in children(proc.proc.pid)["frontend"]  # the other one was left alone


def run_dir(child: int) -> Path:
    """The run directory (flags, beats) the supervisor gave its ``child`` process."""
    environ = dict(entry.split(b"=", 1) for entry in Path(f"/proc/{child}/environ").read_bytes().split(b"\0") if entry)
    return Path(environ[runtime.RUN_DIR.encode()].decode())


def ready_flags(supervisor: int):
    """A reader of the service's readiness flags (runtime.ReadyFlags: the engine's byte, then each front end's)."""
    (frontend, *_) = children(supervisor)["frontend"]
    return (run_dir(frontend) / "ready").read_bytes


def test_a_killed_engine_answers_its_requests_in_flight_at_once_and_comes_back():
    timeout_s = 60
    with ServiceProcess(**SETTINGS, REQUEST_TIMEOUT_S=timeout_s) as proc, ThreadPoolExecutor(4) as pool:
        (engine,) = children(proc.proc.pid)["engine"]
        with workers_held(proc.url, 2) as held:
            queued = [pool.submit(predict, proc.url, 120) for _ in range(4)]
            wait_until(lambda: proc.total("inference_queue_depth") >= 4, 30, "requests not queued")
            started = time.monotonic()
            os.kill(engine, signal.SIGKILL)
            codes = [f.result().status_code for f in [*held, *queued]]
            waited = time.monotonic() - started
        # Answered by the front ends at once (503, retry later), not left to the request timeout.
        # The control is the stalled engine below: stopped, not dead, the link stays up and the same
        # requests wait for their deadline; only the engine's death answers them at once. The bound
        # is the deadline's, not this machine's: well before it, however slow the machine.
        assert codes == [503] * 6 and waited < timeout_s / 2, (codes, waited)
        # Each front end's readiness goes with its link to the engine: the service is ready again only once
        # every front end reaches the new engine (else /readyz, answered by one that reached it, said 200 while
        # the other still refused with 503).
        flags = ready_flags(proc.proc.pid)
        wait_until(lambda: flags()[1:] == b"\0\0", 30, f"the front ends still say they are ready: {flags()}")
        assert httpx.get(proc.url + "/readyz", timeout=5).status_code == 503 or children(proc.proc.pid)["engine"]
        wait_until(lambda: children(proc.proc.pid)["engine"] not in ([], [engine]), 30, "no new engine")
        proc.wait_ready(120)
        assert flags() == b"\1\1\1"
        assert [predict(proc.url).status_code for _ in range(8)] == [200] * 8  # a new connection each: either front end


def test_with_restart_never_a_killed_engine_ends_the_service_non_zero():
    with ServiceProcess(**SETTINGS, RESTART="never") as proc:
        (engine,) = children(proc.proc.pid)["engine"]
        os.kill(engine, signal.SIGKILL)
        assert proc.proc.wait(60) != 0
        assert "--restart never" in proc.output()
    # The control: the same kill with the default restarts the engine and the service stays up
    # (test_a_killed_engine_answers_its_requests_in_flight_at_once_and_comes_back).


def test_a_killed_supervisor_takes_its_children_with_it_and_frees_the_port():
    proc = ServiceProcess(**SETTINGS).wait_ready()
    pids = [pid for role in children(proc.proc.pid).values() for pid in role]
    assert len(pids) == 3
    proc.kill()  # SIGKILL: no orderly stop, as a crashed machine or an OOM kill

    def alive(pid: int) -> bool:
        try:  # a zombie (Z) has exited; only its parent's reaping is left
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "a child outlived its supervisor")

    def listens() -> bool:
        try:
            with socket.create_server(("127.0.0.1", proc.port)):
                return True
        except OSError:
            return False

    wait_until(listens, 10, "the port is still taken")  # a replacement can listen


def test_a_stalled_engine_bounds_what_a_front_end_holds_and_every_request_is_answered_by_its_deadline():
    # The engine holds at most devices x (queue capacity + workers x max batch) = 2 x (1 + 8) = 18
    # requests; a front end holds no more for it. Stopped (SIGSTOP), it answers nothing: the front end
    # refuses what is past the bound at once (503), and answers the rest at their deadline (504).
    with ServiceProcess(**{**SETTINGS, "FRONTENDS": 1}, QUEUE_CAPACITY=1, REQUEST_TIMEOUT_S=2) as proc, \
            ThreadPoolExecutor(60) as pool:
        (engine,) = children(proc.proc.pid)["engine"]
        def timed(_) -> tuple[int, float]:
            started = time.monotonic()
            return predict(proc.url, 30).status_code, time.monotonic() - started

        # What the same burst of 60 costs on this machine, the engine running: served up to the bound,
        # refused past it; the last answer when the burst is through.
        served = list(pool.map(timed, range(60)))
        codes = [code for code, _ in served]
        assert set(codes) <= {200, 503} and 200 in codes, served
        burst_s = max(took for _, took in served)
        os.kill(engine, signal.SIGSTOP)
        try:
            answers = list(pool.map(timed, range(60)))
        finally:
            os.kill(engine, signal.SIGCONT)
        refused = [took for code, took in answers if code == 503]
        expired = [took for code, took in answers if code == 504]
        assert len(refused) + len(expired) == 60, answers
        # At most 18 wait at a time: the rest are refused (a slow machine may send some after the
        # first 18 expired, and those wait in their place).
        assert len(expired) >= 18 and len(refused) >= 60 - 2 * 18, answers
        # Each answered by its deadline (2 s, and the front end's 1 s margin), not the client's 30 s.
        # A refusal comes as soon as the front end reads it: within what the served burst took, doubled
        # for a busy machine's stalls. An expired request waits that long at most, besides its deadline
        # and the front end's pass over the expired (one each SWEEP_S, not a timer a request).
        deadline_s = 2 + 1
        report = (f"served burst {burst_s:.2f} s; refused {len(refused)} in at most {max(refused):.2f} s, "
                  f"expired {len(expired)} in {min(expired):.2f} to {max(expired):.2f} s")
        print(report)
        assert max(refused) < 2 * burst_s, report
        assert max(expired) < deadline_s + SWEEP_S + 2 * burst_s, report
        proc.wait_ready(30)
        assert predict(proc.url).status_code == 200  # the engine, resumed, serves again


def beat_age(child: int, index: int) -> float | None:
    """Seconds since process ``index`` of the run last beat, read from the run directory the
    supervisor gave ``child``; None before its first beat."""
    return runtime.Heartbeats(run_dir(child) / "beats").silent_for(index, time.monotonic())


@pytest.mark.parametrize("role, hung_after_s", [("engine", 2), ("frontend", 2), ("engine", 0)])
def test_a_hung_process_is_killed_and_started_again(role, hung_after_s):
    # Hung (SIGSTOP): alive, its ipc connection up, its event loop never running. Past --hung-after-s
    # the supervisor kills it, and the death's own handling follows: a replacement that serves.
    with ServiceProcess(**{**SETTINGS, "FRONTENDS": 1}, HUNG_AFTER_S=hung_after_s) as proc:
        roles = children(proc.proc.pid)
        (hung,), index = roles[role], 0 if role == "engine" else 1
        witness = roles["frontend" if role == "engine" else "engine"][0]
        os.kill(hung, signal.SIGSTOP)
        try:
            if not hung_after_s:
                # The control: with the watch off, the same hang is left alone, however long it lasts
                # (three times the other cases' limit, as its own beat shows).
                wait_until(lambda: (beat_age(witness, index) or 0) > 6, 30, "the stopped process still beat")
                assert children(proc.proc.pid)[role] == [hung]
                return
            wait_until(lambda: children(proc.proc.pid)[role] not in ([], [hung]), 30, f"the hung {role} was not replaced")
        finally:
            with contextlib.suppress(ProcessLookupError):  # reaped once killed
                os.kill(hung, signal.SIGCONT)
        proc.wait_ready(120)
        assert predict(proc.url).status_code == 200
        assert "its event loop has not run for" in proc.output()


def sleeps(pid: int) -> int:
    """How many times ``pid`` has gone to sleep (its voluntary context switches)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no context switch count for {pid}")


def test_a_paused_service_is_not_taken_for_a_hung_one():
    # The whole service paused past --hung-after-s (docker pause, SIGSTOP of the group, a stalled VM)
    # and resumed: the supervisor, back first, does not kill a child whose beat is old only because
    # it was paused too. Without its own-pause rule it kills the engine at its first look.
    with ServiceProcess(**{**SETTINGS, "FRONTENDS": 1}, HUNG_AFTER_S=2) as proc:
        supervisor = proc.proc.pid
        (engine,) = children(supervisor)["engine"]
        os.kill(supervisor, signal.SIGSTOP)
        os.kill(engine, signal.SIGSTOP)
        try:
            wait_until(lambda: (beat_age(engine, 0) or 0) > 3, 30, "the stopped engine still beat")
            slept = sleeps(supervisor)
        finally:
            os.kill(supervisor, signal.SIGCONT)
        # Resumed first, the supervisor looks several times at the engine's old beat (a look between
        # two of its 50 ms sleeps) before the engine resumes: the window in which it would kill it.
        try:
            wait_until(lambda: sleeps(supervisor) >= slept + 5, 30, "the supervisor did not run")
        finally:
            os.kill(engine, signal.SIGCONT)
        proc.wait_ready(30)
        assert children(supervisor)["engine"] == [engine]
        assert predict(proc.url).status_code == 200
        assert "its event loop has not run for" not in proc.output()
