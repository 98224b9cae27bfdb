"""PaddleX serving against the service, both on PaddleX's own OCR pipeline file, in interleaved rounds:

    python benchmarks/paddlex_serving.py [--rounds 3] [--requests 16] [--clients 4 8] [--passes 1]
                                         [--api auto|ocr|v2] [--workers-per-device N] [--ours-flag=--F=V ...]
                                         [--ours-default-run-mode]
                                         [--textline-orientation | --doc-preprocessor | --detection |
                                          --structure]
    python benchmarks/paddlex_serving.py --cpu-scaling [--rounds 3] [--requests 16]

Needs the PaddleX reference venv (tests/support/paddlex_reference.py: paddlex 3.7.2 and its serving under
``$XDG_CACHE_HOME/placeenv/paddlex-3.7.2``, made on first use) and PaddleOCR's PP-OCRv5_mobile exports
(``models()``, same cache).

  PaddleX    ``paddlex --serve --pipeline FILE --device cpu`` (its FastAPI app under uvicorn), driven with
             ``POST /ocr {"file": <base64>, "fileType": 1, "visualize": false}`` (its default visualize true
             draws and encodes result images, which costs time)
  ours       ``python -m placeenv.serve --model-repository R --devices cpu`` with ``R/ocr/pipeline.yaml``
             the same file (pipeline ``ocr``), driven with ``POST /ocr`` where the service answers it (the
             same body and answer as PaddleX's), else v2 (tritonclient's binary encoding: ``image`` BYTES
             [1], the five outputs binary); ``--api`` picks one

Both start once on 127.0.0.1 (free ports; a deadline for ready) on the same file and the same 24 generated
pages (loadtest/pages.py); each gets one unrecorded pass over the pages first (its predictors' first
runs). Each round measures one at a time (the other idle), the order alternating per round: c=1 (each page
``--passes`` times, one client, sequential: p50 and mean latency), then throughput over ``--requests``
requests cycling over the pages at each of ``--clients`` concurrent clients (a thread each with its own
HTTP session). Every answer's rec_texts is checked against PaddleX's first c=1 answer for that page.
Our per-stage times come from the statistics of ocr.pipeline (PaddleX's pipeline object on a CPU worker, its
calls' waits included) / ocr.TextDetection / ocr.TextRecognition (``/v2/models/<m>/stats``) around our whole measurement in the last round (c=1 and
every concurrency). With the defaults a run takes about 10 minutes on an idle 2-core VM (23 under another
engineer's tests, docs/benchmarks.md, "PaddleX serving").

``--textline-orientation`` runs both on the file with text-line orientation on
(tests/support/ocr_textline_pipeline.yaml, the classifier tests/support/textline_model.py trains, its
``batch_size`` 1 on both sides: PaddleX 3.7.2 gives every crop of a larger batch its first crop's class)
and pages with every third line upside down. ``--doc-preprocessor`` runs both on the file with the document
preprocessor on (tests/support/ocr_docpre_pipeline.yaml, the page-orientation and unwarping stand-ins
tests/support/standin_models.py builds) and the pages bowed and turned by 0, 90, 180 and 270 degrees in turn.

``--detection`` runs both on PaddleX's object_detection file (tests/support/object_detection_pipeline.yaml:
the PicoDet-S stand-in tests/support/standin_models.py builds, ``batch_size`` 4 on both sides) and images of
red, green and blue rectangles at four sizes, through ``POST /object-detection`` on both; PaddleX serving
from a venv with ``paddlex[cv]`` over the reference venv (``paddlex_reference.cv_python``: its vision
pipelines need it to start). The answers compared are the classes and boxes to the nearest 2 px.

``--structure`` runs both on PaddleX's PP-StructureV3 file (tests/support/pp_structurev3_pipeline.yaml: PP-OCRv5
mobile and the stand-ins of its other models, tests/support/standin_*.py) and document pages
(loadtest/documents.py: a title, paragraphs, a table, a formula, a seal each), through ``POST /layout-parsing``
on both (``visualize`` false; its Markdown, with its images, as PaddleX serving's default asks). The answers
compared are each page's blocks: class and content.

``--cpu-scaling`` measures instead how the pipeline's CPU work scales from 1 to 2 CPU workers
(``PLACEENV_PADDLEX_CPU_WORKERS``, models/paddlex.py): two services, 1 and 2 workers, interleaved, the
throughput at the largest ``--clients``; then, in this process, the CPU steps' pure CPU parts (decode,
det resize/normalise, DB postprocess, sort, crops, rec resize/batch, CTC decode; the networks' outputs
computed beforehand) over the pages in 1 thread against the same work split over 2 threads. OpenCV's own
thread pool (``cv2.getNumThreads()``) stays as it is, as in the service.

Prints a Markdown table: per figure median (min..max) over the rounds and the per-round ratios, with the
date, the machine and the command; writes results/paddlex_serving.json.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import logging
import os
import platform
import shlex
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
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import save_results  # noqa: E402

from placeenv.testing import free_port  # noqa: E402
from loadtest import pages as page_maker  # noqa: E402
from tests.support import standin_models  # noqa: E402
from tests.support import paddlex_reference as reference  # noqa: E402

logging.getLogger("httpx").setLevel(logging.WARNING)  # importing PaddleX would log every request

MODEL = "ocr"
STEPS = ("ocr.pipeline", "ocr.TextDetection", "ocr.TextRecognition")
DETECTION_STEPS = ("ocr.pipeline", "ocr.ObjectDetection")
V2_OUTPUTS = ("rec_texts", "rec_scores", "rec_polys", "rec_boxes", "dt_polys")
JSON_HEADERS = {"Content-Type": "application/json"}


DETECTION_PIPELINE = ROOT / "tests" / "support" / "object_detection_pipeline.yaml"
STRUCTURE_STEPS = ("ocr.pipeline", "ocr.LayoutDetection", "ocr.GeneralOCR.TextDetection", "ocr.TextRecognition")


def detection_image(index: int) -> bytes:
    """Image ``index`` of the detection run: ``standin_models.shapes`` at one of four sizes, PNG."""
    import cv2

    width, height = ((640, 480), (1024, 768), (800, 800), (1280, 720))[index % 4]
    return cv2.imencode(".png", standin_models.shapes(1000 + index, width, height)[0])[1].tobytes()


def document_image(index: int) -> bytes:
    """Page ``index`` of the PP-StructureV3 run: ``loadtest.documents.document``, PNG."""
    import cv2

    from loadtest import documents

    return cv2.imencode(".png", documents.document(index)[0])[1].tobytes()


def structure_file(tmp: Path) -> Path:
    """The PP-StructureV3 file for PaddleX serving, its exports placed under ``tmp/models``."""
    models = standin_models.place_structure(tmp / "models", pipeline=False)
    return reference.pipeline_file(tmp, models, template=standin_models.STRUCTURE_PIPELINE)


def say(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


# -- the two servers --------------------------------------------------------------------------------


class Process:
    """A server process with its log in ``log``; ready when ``probe`` (a GET path) answers 200."""

    def __init__(self, name: str, command: list[str], env: dict, port: int, probe: str, log: Path,
                 deadline_s: float) -> None:
        self.name, self.port, self.url, self.log = name, port, f"http://127.0.0.1:{port}", log
        began = time.monotonic()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({self.proc.returncode}): {self.tail()}")
            try:
                if httpx.get(self.url + probe, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - began > deadline_s:
                self.stop()
                raise RuntimeError(f"{name} not ready after {deadline_s:.0f} s: {self.tail()}")
            time.sleep(0.5)
        self.start_s = time.monotonic() - began

    def resident_mib(self) -> float:
        """Resident memory of the server's processes (its session: uvicorn's and Paddle's children too), MiB."""
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == self.proc.pid:  # the session id (field 6 of stat)
                    total += int(fields[21])  # resident pages (field 24)
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
        return total * os.sysconf("SC_PAGE_SIZE") / 2**20

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: uvicorn's and Paddle's children too
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def start_paddlex(pipeline: Path, tmp: Path, deadline_s: float, cv: bool = False) -> Process:
    port = free_port()
    command = reference.serve_command(pipeline, port, cv=cv)
    return Process("PaddleX serving", command, {**reference.environment()}, port, "/health",
                   tmp / "paddlex.log", deadline_s)


def start_ours(repository: Path, tmp: Path, deadline_s: float, cpu_workers: int | None = None,
               workers_per_device: int | None = None, tag: str = "ours", flags: tuple[str, ...] = ()) -> Process:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}
    env.update({"PLACEENV_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT)})
    if cpu_workers is not None:
        env["PLACEENV_PADDLEX_CPU_WORKERS"] = str(cpu_workers)
    command = [sys.executable, "-m", "placeenv.serve", "--model-repository", str(repository), "--devices", "cpu",
               "--port", str(port), "--host", "127.0.0.1"]
    if workers_per_device:
        command += ["--workers-per-device", str(workers_per_device)]
    command += flags
    return Process(tag, command, env, port, "/v2/health/ready", tmp / f"{tag.replace(' ', '_')}.log", deadline_s)


# -- the two APIs ---------------------------------------------------------------------------------


class OcrApi:
    """PaddleX serving's ``POST /ocr`` (PaddleX, and ours where it answers it)."""

    name = "ocr"

    def __init__(self, url: str, datas: list[bytes]) -> None:
        self.url = url + "/ocr"
        self.bodies = [json.dumps({"file": base64.b64encode(d).decode(), "fileType": 1,
                                   "visualize": False}).encode() for d in datas]

    def __call__(self, client: httpx.Client, page: int) -> list[str]:
        found = client.post(self.url, content=self.bodies[page], headers=JSON_HEADERS)
        found.raise_for_status()
        answer = found.json()
        if answer.get("errorCode") != 0:
            raise RuntimeError(f"/ocr answered errorCode {answer.get('errorCode')}: {answer.get('errorMsg')}")
        return list(answer["result"]["ocrResults"][0]["prunedResult"]["rec_texts"])


class V2Api:
    """The Open Inference Protocol: ``image`` BYTES [1], the five outputs in tritonclient's binary form."""

    name = "v2"

    def __init__(self, url: str, datas: list[bytes]) -> None:
        import tritonclient.http as triton

        self.triton = triton
        self.url = f"{url}/v2/models/{MODEL}/infer"
        self.bodies = []
        for data in datas:
            image = triton.InferInput("image", [1], "BYTES")
            image.set_data_from_numpy(np.array([data], dtype=np.object_), binary_data=True)
            body, header = triton.InferenceServerClient.generate_request_body(
                [image], outputs=[triton.InferRequestedOutput(n, binary_data=True) for n in V2_OUTPUTS])
            self.bodies.append((body, {"Inference-Header-Content-Length": str(header),
                                       "Content-Type": "application/octet-stream"}))

    def __call__(self, client: httpx.Client, page: int) -> list[str]:
        body, headers = self.bodies[page]
        found = client.post(self.url, content=body, headers=headers)
        found.raise_for_status()
        result = self.triton.InferenceServerClient.parse_response_body(
            found.content, header_length=int(found.headers["Inference-Header-Content-Length"]))
        return [t.decode() if isinstance(t, bytes) else str(t) for t in result.as_numpy("rec_texts").reshape(-1)]


class DetectionApi:
    """PaddleX serving's ``POST /object-detection`` (PaddleX's and ours): an answer's classes and boxes to
    the nearest 2 px, best compared."""

    name = "object-detection"

    def __init__(self, url: str, datas: list[bytes]) -> None:
        self.url = f"{url}/{self.name}"
        self.bodies = [json.dumps(self.body(base64.b64encode(d).decode())).encode() for d in datas]

    @staticmethod
    def body(data: str) -> dict:
        return {"image": data, "visualize": False}

    def result(self, client: httpx.Client, page: int) -> dict:
        """Page ``page``'s answer's ``result`` (PaddleX's error shape raised)."""
        found = client.post(self.url, content=self.bodies[page], headers=JSON_HEADERS)
        found.raise_for_status()
        answer = found.json()
        if answer.get("errorCode") != 0:
            raise RuntimeError(f"/{self.name} answered errorCode {answer.get('errorCode')}: {answer.get('errorMsg')}")
        return answer["result"]

    def __call__(self, client: httpx.Client, page: int) -> list[str]:
        return [f"{o['categoryName']} " + " ".join(str(2 * round(v / 2)) for v in o["bbox"])
                for o in self.result(client, page)["detectedObjects"]]


class LayoutApi(DetectionApi):
    """PaddleX serving's ``POST /layout-parsing`` (PaddleX's and ours): each block's class and content."""

    name = "layout-parsing"

    @staticmethod
    def body(data: str) -> dict:
        return {"file": data, "fileType": 1, "visualize": False}

    def __call__(self, client: httpx.Client, page: int) -> list[str]:
        (result,) = self.result(client, page)["layoutParsingResults"]
        return [f"{b['block_label']}: {b['block_content']}" for b in result["prunedResult"]["parsing_res_list"]]


def pick_api(choice: str, url: str, datas: list[bytes]):
    """``ocr`` where the service answers ``POST /ocr`` (probed with the first page), else v2."""
    if choice == "v2":
        return V2Api(url, datas)
    api = OcrApi(url, datas)
    if choice == "ocr":
        return api
    try:
        with httpx.Client(timeout=300) as client:
            api(client, 0)
        return api
    except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
        say(f"ours: POST /ocr not served ({type(exc).__name__}: {str(exc)[:120]}); using v2")
        return V2Api(url, datas)


# -- load ---------------------------------------------------------------------------------------------


def sequential(api, pages: int, passes: int) -> tuple[list[float], list[tuple[int, list[str]]]]:
    """Each page ``passes`` times, one after the other: latencies (s) and (page, rec_texts) per answer."""
    latencies, answers = [], []
    with httpx.Client(timeout=300) as client:
        for _ in range(passes):
            for page in range(pages):
                began = time.perf_counter()
                texts = api(client, page)
                latencies.append(time.perf_counter() - began)
                answers.append((page, texts))
    return latencies, answers


def concurrent(api, pages: int, clients: int, requests: int, offset: int = 0
               ) -> tuple[float, list[float], list[tuple[int, list[str]]]]:
    """``requests`` requests cycling over the pages from page ``offset`` on, from ``clients`` threads, each
    with its own session: req/s over the whole run (first start to last answer), latencies, and (page,
    rec_texts) per answer."""
    lock, taken = threading.Lock(), iter(range(requests))
    latencies, answers, errors = [], [], []
    start = threading.Barrier(clients + 1)

    def client_loop() -> None:
        with httpx.Client(timeout=300) as client:
            start.wait()
            while True:
                with lock:
                    index = next(taken, None)
                if index is None:
                    return
                page = (offset + index) % pages
                began = time.perf_counter()
                try:
                    texts = api(client, page)
                except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                done = time.perf_counter() - began
                with lock:
                    latencies.append(done)
                    answers.append((page, texts))

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"{len(errors)} of {requests} requests failed, first: {errors[0]}")
    return requests / seconds, latencies, answers


def measure(api, pages: int, clients: list[int], requests: int, passes: int, offset: int) -> dict:
    latencies, answers = sequential(api, pages, passes)
    found = {"c1_p50_ms": 1000 * statistics.median(latencies), "c1_mean_ms": 1000 * statistics.mean(latencies),
             "answers": answers}
    for count in clients:
        rate, lat, more = concurrent(api, pages, count, requests, offset)
        found[f"c{count}_rps"] = rate
        found[f"c{count}_p50_ms"] = 1000 * statistics.median(lat)
        found["answers"] = found["answers"] + more
    return found


def stage_stats(url: str, steps: tuple[str, ...] = STEPS) -> dict[str, dict]:
    found = {}
    for step in steps:
        stats = httpx.get(f"{url}/v2/models/{step}/stats", timeout=10).json()["model_stats"][0]
        inference = stats["inference_stats"]
        found[step] = {"count": inference["success"]["count"], "success_ns": inference["success"]["ns"],
                       "queue_ns": inference["queue"]["ns"], "infer_ns": inference["compute_infer"]["ns"],
                       "executions": stats["execution_count"], "inferences": stats["inference_count"]}
    return found


def stage_table(before: dict, after: dict, requests: int) -> str:
    lines = ["| step | calls a request | batches a request | mean batch | queue ms a request | compute ms a request "
             "| in all ms a request |", "|---|---:|---:|---:|---:|---:|---:|"]
    for step in after:
        d = {k: after[step][k] - before[step][k] for k in after[step]}
        batch = d["inferences"] / d["executions"] if d["executions"] else float("nan")
        lines.append(f"| {step} | {d['count'] / requests:.2f} | {d['executions'] / requests:.2f} | {batch:.2f} | "
                     f"{d['queue_ns'] / 1e6 / requests:.1f} | {d['infer_ns'] / 1e6 / requests:.1f} | "
                     f"{d['success_ns'] / 1e6 / requests:.1f} |")
    return "\n".join(lines)


# -- the report -----------------------------------------------------------------------------------------


def spread(values: list[float], digits: int = 2) -> str:
    form = f"{{:.{digits}f}}" if max(values) < 100 else "{:.0f}"
    return f"{form.format(statistics.median(values))} ({form.format(min(values))}..{form.format(max(values))})"


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "?")
    return f"nproc {os.cpu_count()}, {model}, {platform.machine()}, Python {platform.python_version()}"


def header(argv: list[str]) -> str:
    command = "python benchmarks/paddlex_serving.py " + " ".join(shlex.quote(a) for a in argv)
    return (f"{datetime.date.today()} {time.strftime('%H:%M')}, {machine()}\n\n    {command.strip()}\n")


def mismatches(answers: list[tuple[int, list[str]]], truth: dict[int, list[str]]) -> int:
    return sum(texts != truth[page] for page, texts in answers)


# -- the comparison -------------------------------------------------------------------------------------


def compare(args, repository: Path, pipeline: Path, datas: list[bytes], tmp: Path) -> dict:
    say(f"starting PaddleX serving ({reference.venv_dir()}) and ours on {pipeline.name}, {len(datas)} pages")
    theirs = start_paddlex(pipeline, tmp, args.deadline, cv=args.detection)
    try:
        ours = start_ours(repository, tmp, args.deadline, workers_per_device=args.workers_per_device,
                          flags=tuple(args.ours_flag))
    except Exception:
        theirs.stop()
        raise
    try:
        say(f"ready: PaddleX in {theirs.start_s:.1f} s ({theirs.url}), ours in {ours.start_s:.1f} s ({ours.url})")
        if args.detection:
            apis = {"PaddleX": DetectionApi(theirs.url, datas), "ours": DetectionApi(ours.url, datas)}
        elif args.structure:
            apis = {"PaddleX": LayoutApi(theirs.url, datas), "ours": LayoutApi(ours.url, datas)}
        else:
            apis = {"PaddleX": OcrApi(theirs.url, datas), "ours": pick_api(args.api, ours.url, datas)}
        say(f"APIs: PaddleX {apis['PaddleX'].name} (visualize false), ours {apis['ours'].name}")
        truth: dict[int, list[str]] = {}
        for name in ("PaddleX", "ours"):
            say(f"warm-up: {name}, one pass over the pages at c=1, {args.requests} requests at "
                f"{max(args.clients)} clients")
            _, answers = sequential(apis[name], len(datas), 1)
            if name == "PaddleX":
                truth = {page: texts for page, texts in answers}
            concurrent(apis[name], len(datas), max(args.clients), args.requests)
        rounds, wrong = [], {"PaddleX": 0, "ours": 0}
        answered = {"PaddleX": 0, "ours": 0}
        stages = ""
        for number in range(args.rounds):
            order = ("PaddleX", "ours") if number % 2 == 0 else ("ours", "PaddleX")
            found = {}
            for name in order:
                began = time.perf_counter()
                last = number == args.rounds - 1 and name == "ours"
                steps = DETECTION_STEPS if args.detection else STRUCTURE_STEPS if args.structure else STEPS
                before = stage_stats(ours.url, steps) if last else None
                # Each round's throughput runs start a page further on: over the rounds, every page.
                found[name] = measure(apis[name], len(datas), args.clients, args.requests, args.passes,
                                      number * args.requests)
                if last:
                    # The stats cover the whole of this measurement: c=1 and every concurrency.
                    count = len(found[name]["answers"])
                    stages = stage_table(before, stage_stats(ours.url, steps), count)
                answers = found[name].pop("answers")
                wrong[name] += mismatches(answers, truth)
                answered[name] += len(answers)
                say(f"round {number + 1}/{args.rounds} {name}: c=1 p50 {found[name]['c1_p50_ms']:.0f} ms, "
                    + ", ".join(f"c={c} {found[name][f'c{c}_rps']:.2f} req/s" for c in args.clients)
                    + f" ({time.perf_counter() - began:.0f} s)")
            rounds.append(found)
        resident = {"PaddleX": theirs.resident_mib(), "ours": ours.resident_mib()}
    finally:
        for server in (ours, theirs):
            server.stop()
    return {"rounds": rounds, "wrong": wrong, "answered": answered, "stages": stages, "api": apis["ours"].name,
            "start_s": {"PaddleX": theirs.start_s, "ours": ours.start_s}, "resident_mib": resident}


def compare_table(found: dict, clients: list[int]) -> str:
    rounds = found["rounds"]
    figures = [("c1_p50_ms", "c=1 p50, ms"), ("c1_mean_ms", "c=1 mean, ms")]
    for count in clients:
        figures += [(f"c{count}_rps", f"{count} clients, req/s"), (f"c{count}_p50_ms", f"{count} clients p50, ms")]
    lines = ["| figure | PaddleX serving | ours | ours / PaddleX |", "|---|---:|---:|---:|"]
    for key, label in figures:
        theirs = [r["PaddleX"][key] for r in rounds]
        ours = [r["ours"][key] for r in rounds]
        ratio = [o / t for o, t in zip(ours, theirs)]
        digits = 1 if key.endswith("ms") else 2
        lines.append(f"| {label} | {spread(theirs, digits)} | {spread(ours, digits)} | {spread(ratio)} |")
    lines.append(f"| answers differing from PaddleX's c=1 answer | {found['wrong']['PaddleX']} of "
                 f"{found['answered']['PaddleX']} | {found['wrong']['ours']} of {found['answered']['ours']} | |")
    lines.append(f"| start-up to ready, s | {found['start_s']['PaddleX']:.1f} | {found['start_s']['ours']:.1f} | |")
    lines.append(f"| resident memory after the rounds, MiB | {found['resident_mib']['PaddleX']:.0f} | "
                 f"{found['resident_mib']['ours']:.0f} | |")
    return "\n".join(lines)


# -- CPU scaling ----------------------------------------------------------------------------------------


def cpu_scaling(args, repository: Path, datas: list[bytes], tmp: Path) -> dict:
    clients = max(args.clients)
    say(f"starting ours with 1 and with 2 CPU workers (PLACEENV_PADDLEX_CPU_WORKERS), {clients} clients")
    servers = {}
    try:
        for workers in (1, 2):
            servers[workers] = start_ours(repository, tmp, args.deadline, cpu_workers=workers,
                                          workers_per_device=args.workers_per_device, tag=f"ours {workers} cpu")
        apis = {w: pick_api(args.api, s.url, datas) for w, s in servers.items()}
        for workers, api in apis.items():
            say(f"warm-up: {workers} CPU worker(s), {args.requests} requests at {clients} clients ({api.name})")
            concurrent(api, len(datas), clients, args.requests)
        rounds = []
        for number in range(args.rounds):
            order = (1, 2) if number % 2 == 0 else (2, 1)
            found = {}
            for workers in order:
                rate, _, _ = concurrent(apis[workers], len(datas), clients, args.requests, number * args.requests)
                found[workers] = rate
                say(f"round {number + 1}/{args.rounds}: {workers} CPU worker(s) {rate:.2f} req/s")
            rounds.append(found)
    finally:
        for server in servers.values():
            server.stop()
    say("micro-benchmark: the CPU steps' pure CPU parts in 1 thread and in 2")
    micro = cpu_micro(datas, args.rounds)
    return {"clients": clients, "rounds": rounds, "micro": micro}


def cpu_micro(datas: list[bytes], rounds: int) -> list[dict]:
    """The pipeline's CPU work a page, as PaddleX's OCR pipeline does it (its processors), with the detector's maps and the recogniser's outputs computed beforehand: every page once
    in 1 thread, then the same pages split between 2 threads; seconds of each, per round."""
    import cv2

    from tests.support import paddlex_processors_demo as demo

    ocr = demo.OCR(reference.models())
    det = demo.DET
    prepared = []
    for data in datas:  # the networks' outputs, once (not timed)
        page = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        resized, shapes = ocr.det_resize([page], limit_side_len=det["limit_side_len"], limit_type=det["limit_type"],
                                         max_side_limit=det["max_side_limit"])
        maps = demo.run(ocr.det, ocr.det_batch(ocr.det_chw(ocr.det_normalize(resized)))[0])
        crops = groups_of(ocr, page, maps, shapes)[0]
        outputs = [demo.run(ocr.rec, batch)[0] for batch in crops]
        prepared.append((data, maps, outputs))

    def one(data: bytes, maps, outputs) -> int:
        page = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        resized, shapes = ocr.det_resize([page], limit_side_len=det["limit_side_len"], limit_type=det["limit_type"],
                                         max_side_limit=det["max_side_limit"])
        np.ascontiguousarray(ocr.det_chw(ocr.det_normalize(resized))[0][None], dtype=np.float32)
        groups, _ = groups_of(ocr, page, maps, shapes)
        texts = 0
        for output in outputs:
            found, _ = ocr.rec_decode([output])
            texts += len(found)
        return texts + len(groups)

    def work(items) -> None:
        for item in items:
            one(*item)

    work(prepared)  # warm
    found = []
    for _ in range(rounds):
        began = time.perf_counter()
        work(prepared + prepared)
        single = time.perf_counter() - began
        threads = [threading.Thread(target=work, args=(prepared,)) for _ in range(2)]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        double = time.perf_counter() - began
        found.append({"one_thread_s": single, "two_threads_s": double, "speed_up": single / double,
                      "ms_a_page": 1000 * single / (2 * len(prepared))})
        say(f"micro: {2 * len(prepared)} pages, 1 thread {single:.2f} s, 2 threads {double:.2f} s: "
            f"{single / double:.2f}x")
    return found


def groups_of(ocr, page, maps, shapes) -> tuple[list[np.ndarray], list]:
    """As PaddleX's OCR pipeline up to the recogniser: DB postprocess, sort, crops, groups resized and batched."""
    from tests.support.paddlex_processors_demo import DET as det, REC_BATCH_SIZE

    polys, _ = ocr.det_post(maps, shapes, thresh=det["thresh"], box_thresh=det["box_thresh"],
                            unclip_ratio=det["unclip_ratio"])
    polys = ocr.sort(polys[0])
    crops = [c for c in ocr.crop(page, polys) if c.size > 0 and c.shape[0] > 0 and c.shape[1] > 0]
    order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / float(crops[i].shape[0]))
    groups = [order[s:s + REC_BATCH_SIZE] for s in range(0, len(order), REC_BATCH_SIZE)]
    return [ocr.rec_batch(ocr.rec_resize([crops[i] for i in g]))[0] for g in groups], polys


def scaling_table(found: dict) -> str:
    one = [r[1] for r in found["rounds"]]
    two = [r[2] for r in found["rounds"]]
    ratio = [b / a for a, b in zip(one, two)]
    micro = found["micro"]
    lines = ["| figure | 1 CPU worker / thread | 2 | 2 / 1 |", "|---|---:|---:|---:|",
             f"| service, {found['clients']} clients, req/s | {spread(one)} | {spread(two)} | {spread(ratio)} |"]
    if micro:
        single = [m["one_thread_s"] for m in micro]
        double = [m["two_threads_s"] for m in micro]
        lines.append(f"| CPU steps' pure CPU parts, s for 2x the pages | {spread(single)} | {spread(double)} | "
                     f"{spread([m['speed_up'] for m in micro])} (speed-up) |")
        lines.append(f"| CPU steps' pure CPU parts, ms a page (1 thread) | {spread([m['ms_a_page'] for m in micro], 1)} "
                     "| | |")
    return "\n".join(lines)


def without_run_mode(path: Path) -> None:
    """The pipeline file at ``path`` without its detector's ``engine_config``, as PaddleX's OCR.yaml has it."""
    import yaml

    raw = yaml.safe_load(path.read_text())
    raw["SubModules"]["TextDetection"].pop("engine_config", None)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16,
                        help="requests a throughput run, cycling the pages from a page further on each round")
    parser.add_argument("--clients", type=int, nargs="+", default=[4, 8], help="concurrent clients to measure")
    parser.add_argument("--passes", type=int, default=1, help="passes over the pages at c=1 a round")
    parser.add_argument("--pages", type=int, default=24)
    parser.add_argument("--api", choices=("auto", "ocr", "v2"), default="auto",
                        help="ours: POST /ocr or v2 (auto: /ocr where the service answers it)")
    parser.add_argument("--workers-per-device", type=int, default=None, help="ours: --workers-per-device")
    parser.add_argument("--ours-flag", action="append", default=[], help="ours: a flag of the service (repeatable)")
    parser.add_argument("--cpu-scaling", action="store_true",
                        help="1 against 2 CPU workers for the pipeline's CPU steps, and the CPU steps in 1 vs 2 threads")
    parser.add_argument("--deadline", type=float, default=300, help="seconds a server has to be ready")
    parser.add_argument("--textline-orientation", action="store_true",
                        help="both on the file with text-line orientation on (batch size 1), pages with lines "
                        "upside down")
    parser.add_argument("--doc-preprocessor", action="store_true",
                        help="both on the file with the document preprocessor on, pages bowed and turned")
    parser.add_argument("--detection", action="store_true",
                        help="both on PaddleX's object_detection file (the PicoDet-S stand-in, batch_size 4) and "
                        "images of coloured rectangles, through /object-detection; PaddleX's from a venv with "
                        "paddlex[cv] over the reference venv")
    parser.add_argument("--structure", action="store_true",
                        help="both on PaddleX's PP-StructureV3 file (PP-OCRv5 mobile and stand-ins) and document "
                        "pages, through /layout-parsing")
    parser.add_argument("--ours-default-run-mode", action="store_true",
                        help="ours: the file without the detector's engine_config (PaddleX's own default file, "
                        "which PaddleX cannot run on Paddle 3.3; PaddleX keeps its run_mode: paddle)")
    args = parser.parse_args()
    began = time.monotonic()
    say(("CPU scaling: our OCR pipeline with 1 and 2 CPU workers" if args.cpu_scaling else
         "PaddleX serving against ours on PaddleX's OCR pipeline file")
        + (" (--detection: object_detection's)" if args.detection else "")
        + (" (--structure: PP-StructureV3's)" if args.structure else "")
        + f", {args.rounds} rounds, {args.pages} pages; {machine()}")
    if args.textline_orientation + args.doc_preprocessor + args.detection + args.structure > 1:
        parser.error("--textline-orientation, --doc-preprocessor, --detection, --structure: one file at a time")
    if (args.detection or args.structure) and args.cpu_scaling:
        parser.error("--cpu-scaling measures the OCR pipeline's steps")
    if args.detection:
        datas = [detection_image(i) for i in range(args.pages)]
    elif args.structure:
        datas = [document_image(i) for i in range(args.pages)]
    else:
        datas = [p.data for p in page_maker.pages(args.pages, upside_down=3 if args.textline_orientation else 0)]
    if args.doc_preprocessor:
        datas = [standin_models.turned(data, standin_models.TURNS[i % 4], bow=True) for i, data in enumerate(datas)]
    with tempfile.TemporaryDirectory(prefix="paddlex-serving-") as scratch:
        tmp = Path(scratch)
        if args.textline_orientation:
            pipeline = reference.textline_pipeline_file(tmp, batch_size=1)
        elif args.doc_preprocessor:
            pipeline = reference.pipeline_file(tmp, reference.place_docpre_models(tmp / "models"),
                                               template=reference.DOCPRE_PIPELINE)
        elif args.detection:
            pipeline = tmp / "object_detection.yaml"
            pipeline.write_text(DETECTION_PIPELINE.read_text().replace(
                f"model_dir: {standin_models.DETECTION}",
                f"model_dir: {standin_models.copy_to(standin_models.DETECTION, tmp / 'models' / 'det')}"))
        elif args.structure:
            pipeline = structure_file(tmp)
        else:
            pipeline = reference.pipeline_file(tmp)
        (tmp / "repository" / MODEL).mkdir(parents=True)
        shutil.copyfile(pipeline, tmp / "repository" / MODEL / "pipeline.yaml")
        if args.ours_default_run_mode:
            without_run_mode(tmp / "repository" / MODEL / "pipeline.yaml")
        try:
            if args.cpu_scaling:
                found = cpu_scaling(args, tmp / "repository", datas, tmp)
                table = scaling_table(found)
            else:
                found = compare(args, tmp / "repository", pipeline, datas, tmp)
                table = compare_table(found, args.clients)
        except Exception:
            for log in sorted(tmp.glob("*.log")):
                print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
    print()
    print(header(sys.argv[1:]))
    print(table)
    if found.get("stages"):
        print(f"\nOurs, per request, over the last round ({found['api']}):\n")
        print(found["stages"])
    print(f"\n({time.monotonic() - began:.0f} s in all)")
    save_results("paddlex_serving" + ("_cpu_scaling" if args.cpu_scaling else "")
                 + ("_textline" if args.textline_orientation else "")
                 + ("_docpre" if args.doc_preprocessor else "")
                 + ("_detection" if args.detection else "")
                 + ("_structure" if args.structure else ""), args,
                 **{k: v for k, v in found.items()})


if __name__ == "__main__":
    main()
