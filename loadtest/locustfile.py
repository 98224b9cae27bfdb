"""Locust traffic for the inference service, and the leak gate that fails the run.

    locust -f loadtest/ --headless -u 50 -r 10 -t 60s --host http://127.0.0.1:8000

Defaults live in ``locust.conf`` at the repository root (Locust reads it from
the working directory). Traffic: valid predictions across the models with
varied batch sizes, on /predict and on /v2 (bodies encoded and answers decoded by
tritonclient's own codec), plus a small share of deliberately invalid requests that
count as correct when they get the expected 4xx; and, when the service serves the
bundled pipelines, JPEG images through ``classify`` and PNG pages through ``ocr``
(whose line counts are checked against the pages drawn); and when it serves a PaddleX OCR pipeline
file (docs/models.md), real pages through PaddleX serving's ``POST /ocr``, as images and as two-page
PDFs, whose texts are checked against the lines drawn on them (loadtest/pages.py); and when it serves a
PaddleX PP-StructureV3 file, PDFs of document pages (loadtest/documents.py) through
``POST /layout-parsing``, each page's blocks checked against those drawn.

When the run ends, the gate scrapes ``/metrics`` and compares with the scrape
taken when it started; behind a load balancer, ``--prometheus URL`` reads what
grew on every replica from the Prometheus that scrapes them. The process exits non-zero when any
``placeenv_device_leaks_total`` grew, when a configured device served no
request, or when the failure ratio is over ``--max-failure-ratio``.
While it runs, it samples ``/metrics`` into ``<--csv>_service.csv`` for
``loadtest/report.py``.
"""

from __future__ import annotations

import base64
import csv
import importlib.util
import itertools
import logging
import random
import time

import io
from pathlib import Path

import gevent
import numpy as np
import tritonclient.http as triton
import httpx
from PIL import Image
from locust import FastHttpUser, between, events, task
from locust.contrib.fasthttp import LocustBadStatusCode

from loadtest import documents
from loadtest import pages as drawn_pages
from loadtest.gate import Growth, Prometheus, Scrape, evaluate

# The sampler and the gate scrape with httpx, which logs every request at INFO: two lines a
# second with the sampler's 1 s default. Only its warnings belong in the load test's log.
logging.getLogger("httpx").setLevel(logging.WARNING)


def _digits() -> list[list[float]]:
    """Real handwritten digits when scikit-learn is there (it is in the dev extra): ``load_digits().data``, read
    from the file scikit-learn ships without importing scikit-learn (1.5 s of CPU for each Locust process)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover
        return [[float(random.randint(0, 16)) for _ in range(64)] for _ in range(200)]
    rows = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    return np.loadtxt(rows, delimiter=",", usecols=range(64)).tolist()  # (the 65th column is the label)


DIGITS = _digits()

MOBILENET = [[[[round(random.uniform(-1, 1), 3)] * 32 for _ in range(32)] for _ in range(3)] for _ in range(8)]

def v2_request(images: list) -> tuple[bytes, dict]:
    """A mobilenet request in the Open Inference Protocol with binary tensors, encoded by tritonclient."""
    array = np.asarray(images, dtype=np.float32)
    image = triton.InferInput("image", list(array.shape), "FP32")
    image.set_data_from_numpy(array, binary_data=True)
    body, header = triton.InferenceServerClient.generate_request_body(
        [image], outputs=[triton.InferRequestedOutput("fetch_name_0", binary_data=True)])
    return body, {"Inference-Header-Content-Length": str(header), "Content-Type": "application/octet-stream"}


V2_MOBILENET = [v2_request(random.sample(MOBILENET, size)) + (size,) for size in (1, 1, 2)]


def encoded(pixels: np.ndarray, format: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=format)
    return out.getvalue()


def bytes_request(name: str, items: list[bytes], outputs: list[str]) -> tuple[bytes, dict]:
    """A request of one BYTES input (encoded images) in the Open Inference Protocol, by tritonclient."""
    tensor = triton.InferInput(name, [len(items)], "BYTES")
    tensor.set_data_from_numpy(np.array(items, dtype=np.object_), binary_data=True)
    body, header = triton.InferenceServerClient.generate_request_body(
        [tensor], outputs=[triton.InferRequestedOutput(o, binary_data=True) for o in outputs])
    return body, {"Inference-Header-Content-Length": str(header), "Content-Type": "application/octet-stream"}


def page(lines: int) -> np.ndarray:
    """A page of ``lines`` dark bands of blocks, as the bundled ocr pipeline reads one (1x32x128)."""
    pixels = np.full((32, 128), 235, np.uint8)
    for i in range(lines):
        top, left = 2 + i * 10, random.randint(2, 29)
        glyphs = np.random.random((6, random.randint(50, 95))) < 0.6
        glyphs[:, ::5] = False
        pixels[top:top + 6, left:left + glyphs.shape[1]][glyphs] = 30
    return pixels


PHOTOS = [encoded(np.random.randint(0, 256, (64, 64, 3), dtype=np.uint8), "JPEG") for _ in range(8)]
V2_CLASSIFY = [bytes_request("image", random.sample(PHOTOS, size), ["labels", "scores"]) + (size,)
               for size in (1, 1, 2)]
PAGES = [(lines, encoded(page(lines), "PNG")) for lines in (1, 2, 3) for _ in range(3)]
#: What TASK_MODELS calls a PaddleX OCR pipeline file, whatever its name: one with output rec_texts.
PADDLEX_OCR = "(a PaddleX OCR pipeline)"
#: What TASK_MODELS calls a PaddleX PP-StructureV3 pipeline file: one with output markdown.
PADDLEX_LAYOUT = "(a PaddleX PP-StructureV3 pipeline)"
#: The tasks that call a model, by the model each calls: a task is left out of a run whose service does
#: not serve its model (read from /v1/models when the run starts; a service that cannot be read keeps
#: the tasks of the models every default service has, and the gate says why below).
TASK_MODELS = {"digits": "digits", "mobilenet": "mobilenet", "mobilenet_v2": "mobilenet",
               "classify": "classify", "ocr": "ocr", "paddlex_ocr": PADDLEX_OCR, "paddlex_ocr_pdf": PADDLEX_OCR,
               "paddlex_layout": PADDLEX_LAYOUT, "invalid": "digits"}
DEFAULT_MODELS = {"digits", "mobilenet"}
#: Pages of loadtest/pages.py that PP-OCRv5_mobile reads exactly as drawn, with PaddleX's own pipeline too
#: (tests/e2e/test_paddlex.py compares the service with it on all 24): the load test checks every
#: answer's texts against the lines drawn. The smaller sizes, so a request takes a second, not five.
READ_EXACTLY = (0, 1, 3, 5, 7, 9, 10, 12)
#: (base64 body, lines drawn) of each, drawn when a run serves a PaddleX OCR pipeline.
OCR_PAGES: list[tuple[dict, list[str]]] = []
#: (base64 body, lines drawn on each page) of two-page PDFs of those pages, made with them.
OCR_PDFS: list[tuple[dict, list[list[str]]]] = []
#: (base64 body, each page's blocks' classes) of PDFs of a document page, drawn when a run serves a PaddleX
#: PP-StructureV3 pipeline.
LAYOUT_PDFS: list[tuple[dict, list[list[str]]]] = []

INVALID = [  # (name, body, expected status)
    ("unknown model", {"model": "no-such-model", "inputs": [DIGITS[0]]}, 404),
    ("wrong shape", {"model": "digits", "inputs": [[1.0] * 63]}, 400),
    ("out of range", {"model": "digits", "inputs": [[17.0] * 64]}, 400),
    ("empty inputs", {"model": "digits", "inputs": []}, 400),
    ("not numbers", {"model": "digits", "inputs": [["x"] * 64]}, 400),
    ("missing model", {"inputs": [DIGITS[0]]}, 422),
]


@events.init.add_listener
def _clock(environment, **_):
    """Reads what the service serves and draws its pages (``_prepare``), then brings gevent's clock up to date
    just before Locust arms ``--run-time``.

    Locust (2.47.0, and every version that arms the limit with ``gevent.spawn_later``) times the
    run on the event loop's cached clock, which libev refreshes only when the loop runs. The hub
    is made at ``import locust``, and the loop does not run again until the run starts, so the
    clock still reads the moment before this locustfile's imports (numpy, tritonclient, scikit-
    learn's digits, the encoded bodies above): their CPU time came off ``-t``, all of it on a slow
    machine, where a run stopped with no request sent (docs/observability.md). ``init`` is the
    last event before Locust arms the timer, with no blocking work in between. The pages are drawn here for
    the same reason: drawn when the test starts, on a slow machine they took all of a short ``-t`` (a run of
    10 s beside six busy test workers and a busy loop sent no request).
    """
    if environment.parsed_options is not None and environment.host:
        _prepare(environment)
    gevent.get_hub().loop.update_now()


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--max-failure-ratio", type=float, default=0.01, help="leak gate: allowed failure ratio")
    parser.add_argument("--metrics-sample-s", type=float, default=1.0, help="how often to sample /metrics")
    parser.add_argument("--network-timeout", type=float, default=60.0,
                        help="seconds a request waits for its answer: above the service's --request-timeout-s, so "
                        "that a slow request's answer is the service's 504, not a timeout of the client's own")
    parser.add_argument("--wait-s", type=float, default=0.05,
                        help="the most a user waits between its requests (uniformly from 0): the default keeps the "
                        "service as busy as its users can; more paces them, where the run is about what happens "
                        "under load over time (restarts, model loads) rather than how much load")
    parser.add_argument("--prometheus", default="", help="leak gate: read every replica's growth from this "
                        "Prometheus (behind a load balancer, and across restarts) instead of --host's /metrics")
    parser.add_argument("--prometheus-settle-s", type=float, default=11.0,
                        help="leak gate: wait this long after the run for Prometheus's last scrapes (2 intervals)")


class Unanswered:
    """Requests that got no answer at all (refused, reset, timed out): each is one Locust failure,
    and the log gets one line per ``every_s`` for all of them, so a service that is down or
    draining leaves a readable log instead of a line per request."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s, self.count, self.logged_at = every_s, 0, float("-inf")

    def note(self, response, error: Exception, host: str) -> None:
        self.count += 1
        reason = f"{type(error).__name__}: {error}"
        response.failure(f"no answer: {reason}")
        now = time.monotonic()
        if now - self.logged_at >= self.every_s:
            logging.getLogger("loadtest").warning(
                "service unreachable at %s (%s); %d requests without an answer so far", host, reason, self.count)
            self.logged_at = now


UNANSWERED = Unanswered()


def answered(response, host: str) -> bool:
    """False, and the failure recorded, when the request got no complete HTTP answer: refused, reset
    or timed out before the status line (status 0 in Locust), or cut off in the body (a status, and
    a transport error Locust recorded while reading the rest). A 4xx/5xx is an answer."""
    error = response.request_meta["exception"] or getattr(response, "error", None)
    if response.status_code == 0 or (error is not None and not isinstance(error, LocustBadStatusCode)):
        UNANSWERED.note(response, error, host)
        return False
    return True


class Client(FastHttpUser):
    wait_time = between(0.0, 0.05)
    #: Counts the users started, for each one's first task.
    _started = itertools.count()

    def on_start(self) -> None:
        """A user's first request is the next of the run's tasks in turn, and Locust's weighted random picks
        follow: a run of as many users as tasks sends each of them. Random picks alone leave a slow task out of
        a short run (a 60 s run of 4 users on a loaded machine sent no PP-StructureV3 PDF); ``--stop-timeout``
        lets the requests in flight at the end be answered and counted."""
        kinds = list(dict.fromkeys(self.tasks))
        kinds[next(Client._started) % len(kinds)](self)

    def _predict(self, name: str, body: dict) -> None:
        with self.client.post("/predict", json=body, name=name, catch_response=True) as r:
            if not answered(r, self.host):
                return
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:200]}")
            elif len(r.json()["outputs"]) != len(body["inputs"]):
                r.failure("wrong number of outputs")

    @task(6)
    def digits(self) -> None:
        size = random.choice((1, 1, 1, 2, 4, 8))
        self._predict(f"digits x{size}", {"model": "digits", "inputs": random.sample(DIGITS, size)})

    @task(2)
    def mobilenet(self) -> None:
        size = random.choice((1, 1, 2))
        self._predict(f"mobilenet x{size}", {"model": "mobilenet", "inputs": random.sample(MOBILENET, size)})

    @task(2)
    def mobilenet_v2(self) -> None:
        body, headers, size = random.choice(V2_MOBILENET)
        self._v2("mobilenet", body, headers, f"v2 mobilenet x{size} (binary)",
                 lambda result: result.as_numpy("fetch_name_0").shape == (size, 10) or "wrong output shape")

    def _v2(self, model: str, body: bytes, headers: dict, name: str, check) -> None:
        """A v2 binary request, its answer decoded by tritonclient and given to ``check``, which returns
        True or what is wrong (a failure); inside the request's block, where Locust records it."""
        with self.client.post(f"/v2/models/{model}/infer", data=body, headers=headers, name=name,
                              catch_response=True) as r:
            if not answered(r, self.host):
                return
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:200]}")
                return
            length = r.headers.get("Inference-Header-Content-Length")
            wrong = check(triton.InferenceServerClient.parse_response_body(
                r.content, header_length=int(length) if length else None))
            if wrong is not True:
                r.failure(wrong)

    @task(2)
    def classify(self) -> None:
        body, headers, size = random.choice(V2_CLASSIFY)
        self._v2("classify", body, headers, f"v2 classify x{size} (JPEG)",
                 lambda result: result.as_numpy("labels").shape == result.as_numpy("scores").shape == (size, 3)
                 or "wrong output shape")

    @task(1)
    def ocr(self) -> None:
        pages = random.sample(PAGES, random.choice((1, 2)))
        drawn = [n for n, _ in pages]
        body, headers = bytes_request("page", [p for _, p in pages], ["text", "lines"])
        self._v2("ocr", body, headers, f"v2 ocr x{len(pages)} (PNG)",
                 lambda result: result.as_numpy("lines").tolist() == drawn
                 or f"lines {result.as_numpy('lines').tolist()}, drawn {drawn}")

    @task(1)
    def paddlex_ocr(self) -> None:
        body, lines = random.choice(OCR_PAGES)
        with self.client.post("/ocr", json=body, name="/ocr (PaddleX serving's API)", catch_response=True) as r:
            if not answered(r, self.host):
                return
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:200]}")
                return
            texts = r.json()["result"]["ocrResults"][0]["prunedResult"]["rec_texts"]
            if texts != lines:
                r.failure(f"read {texts[:3]}..., drawn {lines[:3]}...")

    def _paddlex(self, path: str, body: dict, name: str, check) -> None:
        """A request of PaddleX serving's API, its result given to ``check``, which returns True or what is
        wrong (a failure)."""
        with self.client.post(path, json=body, name=name, catch_response=True) as r:
            if not answered(r, self.host):
                return
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:1500]}")
                return
            wrong = check(r.json()["result"])
            if wrong is not True:
                r.failure(wrong)

    @task(1)
    def paddlex_ocr_pdf(self) -> None:
        body, lines = random.choice(OCR_PDFS)
        self._paddlex("/ocr", body, "/ocr, a 2-page PDF (PaddleX serving's API)", lambda result: (
            [page["prunedResult"]["rec_texts"] for page in result["ocrResults"]] == lines
            or f"read {[p['prunedResult']['rec_texts'][:2] for p in result['ocrResults']]}, drawn "
               f"{[page[:2] for page in lines]}"))

    @task(1)
    def paddlex_layout(self) -> None:
        body, labels = random.choice(LAYOUT_PDFS)

        def check(result):
            found = [sorted(block["block_label"] for block in page["prunedResult"]["parsing_res_list"])
                     for page in result["layoutParsingResults"]]
            if found != labels:
                return f"blocks {found}, drawn {labels}"
            return all("<table" in page["markdown"]["text"] for page in result["layoutParsingResults"]) or \
                "a page's Markdown has no table"

        self._paddlex("/layout-parsing", body, "/layout-parsing, a PDF (PaddleX serving's API)", check)

    @task(1)
    def invalid(self) -> None:
        name, body, expected = random.choice(INVALID)
        with self.client.post("/predict", json=body, name=f"invalid: {name}", catch_response=True) as r:
            if not answered(r, self.host):
                return
            if r.status_code == expected and "detail" in r.json():
                r.success()
            else:
                r.failure(f"expected {expected}, got {r.status_code}: {r.text[:200]}")


_state: dict = {}


def _prepare(environment) -> None:
    """What the run's service serves (its tasks), and the pages of its PaddleX pipelines, drawn once: at
    ``init`` where the host is given, else when the test starts (a host typed into the web UI)."""
    if _state.get("prepared") == environment.host:
        return
    try:
        models = httpx.get(environment.host + "/v1/models", timeout=10).json()["models"]
        served = {m["name"] for m in models}
        paddlex = {m["name"] for m in models if any(o["name"] == "rec_texts" for o in m["outputs"])}
        if paddlex:  # (one named ocr is not the bundled ocr pipeline)
            served = (served - paddlex) | {PADDLEX_OCR}
        if any(o["name"] == "markdown" for m in models for o in m["outputs"]):
            served.add(PADDLEX_LAYOUT)
    except (*UNREACHABLE, TypeError):  # the gate says so below; traffic goes to the models every service has
        served = DEFAULT_MODELS
    if PADDLEX_OCR in served and not OCR_PAGES:
        for index in READ_EXACTLY:
            drawn = drawn_pages.page(index)
            OCR_PAGES.append(({"file": base64.b64encode(drawn.data).decode(), "fileType": 1, "visualize": False},
                              list(drawn.lines)))
        for first, second in zip(READ_EXACTLY[::2], READ_EXACTLY[1::2]):
            pair = [drawn_pages.page(first), drawn_pages.page(second)]
            OCR_PDFS.append((_pdf_body(documents.pdf_of([p.data for p in pair])), [list(p.lines) for p in pair]))
    if PADDLEX_LAYOUT in served and not LAYOUT_PDFS:
        for seed in range(8):  # (a page of them takes PP-StructureV3 seconds on a CPU)
            page, blocks = documents.document(seed)
            pdf = documents.pdf_of([encoded(page[:, :, ::-1], "PNG")])
            LAYOUT_PDFS.append((_pdf_body(pdf), [sorted(label for label, _, _ in blocks)]))
    unserved = {task for task, model in TASK_MODELS.items() if model not in served}
    Client.tasks = [t for t in Client.tasks if t.__name__ not in unserved]  # before any user starts
    Client.network_timeout = environment.parsed_options.network_timeout
    Client.wait_time = between(0.0, environment.parsed_options.wait_s)
    _state["prepared"] = environment.host


@events.test_start.add_listener
def _start(environment, **_):
    if environment.parsed_options is None or not environment.host:
        return
    _prepare(environment)
    if environment.parsed_options.prometheus:
        _state["start"] = time.time()
        return
    try:
        _state["start"] = Scrape.take(environment.host)
    except UNREACHABLE as error:
        _state["start"], _state["unreachable"] = None, _reason(error)
    csv_prefix = environment.parsed_options.csv_prefix
    if csv_prefix:
        _state["sampler"] = gevent.spawn(_sample, environment, f"{csv_prefix}_service.csv")


def _pdf_body(pdf: bytes) -> dict:
    return {"file": base64.b64encode(pdf).decode(), "fileType": 0, "visualize": False}


def _sample(environment, path: str) -> None:
    """Per-device counters and gauges over time, for the report's plots."""
    start = time.time()
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["elapsed_s", "device", "requests_ok_total", "queue_depth", "leaks_total"])
        while True:
            try:
                scrape = Scrape.take(environment.host)
            except Exception:  # noqa: BLE001 - a missed sample is not the gate's business
                scrape = None
            if scrape is not None:
                now = round(time.time() - start, 2)
                for device in scrape.devices:
                    out.writerow([now, device, scrape.ok(device), scrape.queue_depth(device), scrape.leaks()])
                f.flush()
            gevent.sleep(environment.parsed_options.metrics_sample_s)


#: What "the service (or Prometheus) could not be read" looks like to the gate.
UNREACHABLE = (httpx.HTTPError, RuntimeError, ValueError, KeyError)


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error)[:120]}"


@events.quitting.add_listener
def _gate(environment, **_):
    options = environment.parsed_options
    if "start" not in _state:
        if options is not None and environment.host and options.headless and not options.worker:
            # Locust quit before its test started (an early --run-time stop did this): no load ran.
            print("leak gate: FAIL: the run ended before any load started; requests 0, failures 0")
            environment.process_exit_code = 1
        return
    if "sampler" in _state:
        _state["sampler"].kill()
    if environment.runner is not None:
        # Ended by SIGTERM (or Ctrl-C) rather than -t, Locust fires `quitting` with its users still
        # sending: stop them, so the window the gate reads is the run's, and its counts are final.
        environment.runner.stop()
    stats = environment.stats.total
    source = options.prometheus or environment.host
    try:
        if options.prometheus:
            time.sleep(options.prometheus_settle_s)
            growth = Prometheus(options.prometheus).growth(_state["start"], time.time())
        elif _state["start"] is None:
            raise ConnectionError(_state["unreachable"])
        else:
            growth = Growth.between(_state["start"], Scrape.take(environment.host))
    except (ConnectionError, *UNREACHABLE) as error:
        reason = str(error) if isinstance(error, ConnectionError) else _reason(error)
        print(f"leak gate: FAIL: {'Prometheus' if options.prometheus else 'service'} unreachable at {source} "
              f"({reason}); requests {stats.num_requests}, failures {stats.num_failures}")
        environment.process_exit_code = 1
        return
    verdict = evaluate(growth, stats.num_requests, stats.num_failures, options.max_failure_ratio)
    print(verdict.summary())
    if not verdict.ok:
        environment.process_exit_code = 1
