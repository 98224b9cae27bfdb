"""A request's own deadline, its cancellation and its priority, through tritonclient against a real service.

The worker of the one device is held by the test model ``gate`` (tests/repository/gate), so what is sent
meanwhile waits in the device queue for as long as the test wants, whatever the machine's speed. Every
queued request is a ``gate`` request of its own port: the order in which the worker connects to those
ports is the order it ran them, and a port nobody connects to is a request that never ran. Each test runs
in the single process and with one front end (the link's cancel message).
"""

from __future__ import annotations

import selectors
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from support import wait_until
from support.servers import ServiceProcess, free_port, workers_held
from tritonclient.utils import InferenceServerException

#: The deadline a request asks for, in microseconds (Triton's unit), and what it may take beyond it
#: here: a machine several times slower than this one still answers within it. The deadline leaves a
#: request the time to reach the queue on a loaded machine: at 50 ms, a gRPC call on a 2-core machine
#: running the suite on three workers beside a busy loop was cancelled by its deadline before its front
#: end had handed it to the engine, and no request was ever queued.
DEADLINE_US = 1_000_000
MARGIN_S = 1.0
#: How long a test waits for what must come (generous: it costs nothing when things go well).
WAIT_S = 60


@pytest.fixture(scope="module", params=[0, 1], ids=["one-process", "1-frontend"])
def service_settings(request):
    return {"MODELS": "digits,gate,gate_chain", "DEVICES": "sim:0", "WORKERS_PER_DEVICE": 1, "GRPC_PORT": free_port(),
            "FRONTENDS": request.param}


@pytest.fixture(scope="module")
def served(service, service_settings):
    """The service, its tritonclient addresses (HTTP, gRPC)."""
    return service, service.url.removeprefix("http://"), f"127.0.0.1:{service_settings['GRPC_PORT']}"


class Gate:
    """Ports for ``gate`` requests, one each: ``ran()`` is the next request the worker reaches (it connects
    to that request's port), which it then lets go."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.listeners: dict[int, socket.socket] = {}

    def port(self) -> int:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        self.listeners[port] = listener
        self.selector.register(listener, selectors.EVENT_READ, port)
        return port

    def reached(self, timeout: float) -> tuple[int, socket.socket] | None:
        """The port the worker connects to next, and its connection (held: the worker waits on it)."""
        for key, _ in self.selector.select(timeout):
            connection, _ = key.fileobj.accept()
            return key.data, connection
        return None

    def ran(self, timeout: float = WAIT_S) -> int | None:
        """The port of the next request the worker runs (let go at once), or None within ``timeout``."""
        found = self.reached(timeout)
        if found is None:
            return None
        found[1].close()
        return found[0]

    def close(self) -> None:
        self.selector.close()
        for listener in self.listeners.values():
            listener.close()


@pytest.fixture
def gate():
    found = Gate()
    yield found
    found.close()


def port_input(module, port: int):
    item = module.InferInput("port", [1, 1], "FP32")
    item.set_data_from_numpy(np.array([[port]], np.float32))
    return item


def http_infer(host: str, port: int, network_timeout: float = 120.0, **terms):
    """A ``gate`` request over HTTP (tritonclient), its answer; ``terms``: timeout, priority."""
    client = th.InferenceServerClient(host, network_timeout=network_timeout)
    try:
        return client.infer("gate", [port_input(th, port)], **terms)
    finally:
        client.close()


def timed(call, *args, **kwargs) -> tuple[float, BaseException | None]:
    """Seconds from sending to the answer of ``call``, and the error it answered with (None: a result)."""
    sent = time.perf_counter()
    try:
        call(*args, **kwargs)
    except Exception as exc:  # the service's error (InferenceServerException), or the client's own
        return time.perf_counter() - sent, exc
    return time.perf_counter() - sent, None


def queued(proc: ServiceProcess, count: int) -> None:
    """Wait until ``count`` jobs are in the device's queue."""
    wait_until(lambda: proc.total("inference_queue_depth", device="sim:0") == count, WAIT_S,
               lambda: f"not {count} queued: {proc.total('inference_queue_depth', device='sim:0')}")


def counted(proc: ServiceProcess, name: str, before: float, more: int, **labels) -> None:
    """Wait until series ``name`` (with ``labels``) is ``before`` + ``more``; fail if it passes it."""
    wait_until(lambda: proc.total(name, **labels) >= before + more, WAIT_S,
               lambda: f"{name}{labels} is {proc.total(name, **labels)}, not {before} + {more}; cancelled by "
               f"stage: {proc.by_label('inference_cancelled_requests_total', 'stage')}")
    assert proc.total(name, **labels) == before + more, (name, labels)


# -- a request's own deadline ----------------------------------------------------------------------


def _behind_held_work(served, gate: Gate, send) -> tuple[float, BaseException | None]:
    """``send(port)`` (a request with a deadline of DEADLINE_US) queued behind a held worker, then a control
    with no deadline of its own queued after it; the deadline's answer (seconds, error). Then the work is
    let go: the control runs, and the request queued ahead of it never does."""
    late, control = gate.port(), gate.port()
    service, host, _ = served
    with ThreadPoolExecutor(2) as pool:
        with workers_held(service.url, 1) as held:
            answer = pool.submit(timed, send, late)
            queued(service, 1)  # (its deadline may have passed already: an expired job stays in the queue)
            waiting = pool.submit(http_infer, host, control)
            queued(service, 2)
            took, error = answer.result(WAIT_S)
            # Answered while the work it was queued behind is still held: well before that work's end; the
            # control, queued the same way with no deadline of its own, is still waiting.
            assert not any(f.done() for f in held) and not waiting.done()
        assert gate.ran() == control  # the worker passed over the expired request, queued ahead of it
        assert waiting.result(WAIT_S).as_numpy("port").tolist() == [[control]]
    return took, error


def test_a_deadline_queued_behind_held_work_is_answered_504_in_time_and_never_run(served, gate):
    proc, host, _ = served
    before = proc.total("inference_expired_requests_total", model="gate", deadline="client", stage="queued")
    took, error = _behind_held_work(served, gate, lambda port: http_infer(host, port, timeout=DEADLINE_US))
    assert error is not None and error.status() == "504", error
    assert f"no answer within {DEADLINE_US / 1e6:.3g} s" in error.message()
    assert DEADLINE_US / 1e6 <= took < DEADLINE_US / 1e6 + MARGIN_S, took
    counted(proc, "inference_expired_requests_total", before, 1, model="gate", deadline="client", stage="queued")
    print(f"HTTP timeout={DEADLINE_US} us: 504 after {took * 1000:.1f} ms")


@pytest.mark.parametrize("terms", [{"client_timeout": DEADLINE_US / 1e6}, {"timeout": DEADLINE_US}],
                         ids=["grpc-deadline", "timeout-parameter"])
def test_a_grpc_deadline_queued_behind_held_work_is_answered_in_time_and_never_run(served, gate, terms):
    # client_timeout: the call's gRPC deadline, which the service takes for the request's; the parameter:
    # the service's own answer at it.
    proc, _, target = served
    before = proc.total("inference_expired_requests_total", model="gate", deadline="client", stage="queued")

    # The channel connects first: the deadline is the request's, not a TCP and HTTP/2 handshake's as well (on a
    # loaded machine those alone can spend the deadline before the request is queued).
    client = tg.InferenceServerClient(target)
    assert client.is_server_live()

    def send(port):
        client.infer("gate", [port_input(tg, port)], **terms)

    try:
        took, error = _behind_held_work(served, gate, send)
    finally:
        client.close()
    assert error is not None and error.status() == "StatusCode.DEADLINE_EXCEEDED", error
    assert DEADLINE_US / 1e6 * 0.8 <= took < DEADLINE_US / 1e6 + MARGIN_S, took
    counted(proc, "inference_expired_requests_total", before, 1, model="gate", deadline="client", stage="queued")
    print(f"gRPC {terms}: DEADLINE_EXCEEDED after {took * 1000:.1f} ms")


def test_the_services_own_limit_applies_when_it_is_the_shorter(served):
    # A timeout of an hour, or 0 (none of the client's own): the service's limit (60 s) stays the deadline,
    # and the request is answered (the control for the 400s below: these terms are valid).
    proc, host, target = served
    pixels = np.zeros((1, 64), np.float32)
    for module, client in ((th, th.InferenceServerClient(host)), (tg, tg.InferenceServerClient(target))):
        item = module.InferInput("pixels", [1, 64], "FP32")
        item.set_data_from_numpy(pixels)
        for terms in ({"timeout": 3_600_000_000}, {"timeout": 0}, {"priority": 1}, {"priority": 0}):
            assert client.infer("digits", [item], **terms).as_numpy("label").shape == (1,), terms


# -- what a client may send ------------------------------------------------------------------------


@pytest.mark.parametrize("name, value", [("timeout", -1), ("timeout", 0.5), ("timeout", "50000"), ("timeout", True),
                                         ("priority", 2), ("priority", -1), ("priority", "1"), ("priority", 1.0)])
def test_an_invalid_timeout_or_priority_is_a_400_naming_it_and_what_to_send(served, name, value):
    proc, _, _ = served
    body = {"parameters": {name: value},
            "inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    answer = httpx.post(f"{proc.url}/v2/models/digits/infer", json=body, timeout=WAIT_S)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert f"parameter {name} {value!r}" in message
    assert ("whole number >= 0" if name == "timeout" else "send 1 (high) or 0") in message
    body["parameters"] = {}  # the control: the same request without the parameter is answered
    assert httpx.post(f"{proc.url}/v2/models/digits/infer", json=body, timeout=WAIT_S).status_code == 200


@pytest.mark.parametrize("terms, named", [({"timeout": -1}, "parameter timeout -1"),
                                          ({"priority": 2}, "parameter priority 2")])
def test_an_invalid_grpc_timeout_or_priority_is_invalid_argument(served, terms, named):
    _, _, target = served
    item = tg.InferInput("pixels", [1, 64], "FP32")
    item.set_data_from_numpy(np.zeros((1, 64), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        tg.InferenceServerClient(target).infer("digits", [item], **terms)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT" and named in refused.value.message()


# -- cancellation ----------------------------------------------------------------------------------


def test_requests_whose_clients_leave_are_never_run_and_counted(served, gate):
    # The worker runs a gRPC request (H) on the gate; queued behind it: an HTTP request whose client gives
    # up and closes its connection (A), a gRPC call the client cancels (B), and a control (C). H is
    # cancelled while running. Let go, the worker drops H's answer and runs C: A and B, queued ahead of
    # C, never ran.
    proc, host, target = served
    labels = {"model": "gate"}
    before = {stage: proc.total("inference_cancelled_requests_total", stage=stage, **labels)
              for stage in ("queued", "running")}
    answered = proc.total("inference_requests_total", status="cancelled", **labels)
    client = tg.InferenceServerClient(target)
    holder, a, b, c = (gate.port() for _ in range(4))
    callbacks: dict[str, Future] = {"H": Future(), "B": Future()}

    def callback(which):
        return lambda result, error: callbacks[which].set_result(error)

    with ThreadPoolExecutor(2) as pool:
        running = client.async_infer("gate", [port_input(tg, holder)], callback=callback("H"))
        reached = gate.reached(WAIT_S)
        assert reached is not None and reached[0] == holder, "the worker did not begin the holder"
        left = pool.submit(timed, http_infer, host, a, network_timeout=3.0)
        queued(proc, 1)
        cancelled = client.async_infer("gate", [port_input(tg, b)], callback=callback("B"))
        queued(proc, 2)
        control = pool.submit(http_infer, host, c)
        queued(proc, 3)
        cancelled.cancel()
        took, error = left.result(WAIT_S)  # the HTTP client gave up: its connection is closed
        assert isinstance(error, TimeoutError) and took >= 3.0, (error, took)
        counted(proc, "inference_cancelled_requests_total", before["queued"], 2, stage="queued", **labels)
        queued(proc, 1)  # they left the queue: only the control is left
        running.cancel()
        counted(proc, "inference_cancelled_requests_total", before["running"], 1, stage="running", **labels)
        reached[1].close()  # let the holder's run end
        assert gate.ran() == c
        assert control.result(WAIT_S).as_numpy("port").tolist() == [[c]]
    assert gate.ran(timeout=0) is None  # nothing else ran
    for which in ("H", "B"):
        assert "CANCELLED" in str(callbacks[which].result(WAIT_S)), which
    counted(proc, "inference_requests_total", answered, 3, status="cancelled", **labels)


@pytest.mark.parametrize("leaves", [True, False], ids=["client-leaves", "control"])
def test_a_pipeline_whose_client_leaves_takes_no_further_step(served, gate, leaves):
    # gate_chain: gate, then gate again on the same port. Its client cancels while the first step runs;
    # once the worker has ended that step, a control request queued behind runs, and the pipeline's
    # second step never does (it would have been queued as the first step's answer came, ahead of
    # the control). The control of the test: a client that stays gets its second step, then its answer.
    proc, host, target = served
    port, control = gate.port(), gate.port()
    finished: Future = Future()
    call = tg.InferenceServerClient(target).async_infer(
        "gate_chain", [port_input(tg, port)], callback=lambda result, error: finished.set_result((result, error)))
    reached = gate.reached(WAIT_S)
    assert reached is not None and reached[0] == port, "the first step did not begin"
    computed = proc.total("inference_compute_duration_seconds_count", model="gate")
    cancelled = proc.total("inference_cancelled_requests_total", model="gate_chain", stage="running")
    if leaves:
        call.cancel()
        counted(proc, "inference_cancelled_requests_total", cancelled, 1, model="gate_chain", stage="running")
    reached[1].close()  # the first step ends
    if not leaves:
        assert gate.ran() == port  # the second step
        result, error = finished.result(WAIT_S)
        assert error is None and result.as_numpy("again").tolist() == [[port]]
        return
    counted(proc, "inference_compute_duration_seconds_count", computed, 1, model="gate")
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(http_infer, host, control)
        assert gate.ran() == control  # not the pipeline's second step
        assert answer.result(WAIT_S).as_numpy("port").tolist() == [[control]]
    assert "CANCELLED" in str(finished.result(WAIT_S)[1])


# -- priority ----------------------------------------------------------------------------------------


def _send_high(protocol: str, host: str, target: str, port: int, priority: int):
    if protocol == "http":
        return http_infer(host, port, priority=priority)
    return tg.InferenceServerClient(target).infer("gate", [port_input(tg, port)], priority=priority)


@pytest.mark.parametrize("protocol, priority", [("http", 1), ("grpc", 1), ("http", 0)],
                         ids=["http-high", "grpc-high", "http-normal-control"])
def test_a_high_priority_request_runs_before_the_normal_ones_queued_before_it(served, gate, protocol, priority):
    # Three normal requests queued behind the held worker, then one at ``priority``: let go, the worker
    # runs the high one first; the control (priority 0) keeps the arrival order.
    proc, host, target = served
    normal = [gate.port() for _ in range(3)]
    last = gate.port()
    with ThreadPoolExecutor(4) as pool:
        with workers_held(proc.url, 1):
            answers = []
            for i, port in enumerate(normal):
                answers.append(pool.submit(http_infer, host, port))
                queued(proc, i + 1)
            answers.append(pool.submit(_send_high, protocol, host, target, last, priority))
            queued(proc, 4)
        order = [gate.ran() for _ in range(4)]
        for answer in answers:
            answer.result(WAIT_S)
    assert order == ([last, *normal] if priority else [*normal, last]), (order, normal, last)
