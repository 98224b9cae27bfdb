"""The service's Predictor runs with and without the GIL, on PaddleX's OCR pipeline file, in interleaved rounds:

    python benchmarks/predictor_runs.py [--rounds 3] [--requests 16] [--clients 8] [--pages 24]

Three services of ours start once on 127.0.0.1 (``--devices cpu``), each on a repository holding the same
PaddleX pipeline file as ``paddlex_serving.py`` uses (``tests/support/ocr_pipeline.yaml``, pipeline ``ocr``):

  binding      ``--no-predictor-runs-without-gil``: the binding's ``Predictor.run()``, which holds the GIL,
               and one Predictor a model on the device, its workers taking turns
  default      the service's defaults: runs without the GIL (placeenv.native), a Predictor a worker, each
               with every core's math threads
  1 thread     the same, with ``engine_config: {cpu_threads: 1}`` for both modules in the file (a core a
               worker's run)

Each gets an unrecorded pass over the pages and a throughput run first. Each round measures one at a time
(the others idle), the order rotating per round: c=1 over every page (p50, mean), then ``--requests``
requests at ``--clients`` concurrent clients (``paddlex_serving.concurrent``). Every answer's rec_texts is
checked against the binding's c=1 answer for its page. Prints a Markdown table, per figure median (min..max)
over the rounds and the ratio to ``binding`` per round, with the services' resident memory at the end;
writes results/predictor_runs.json.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paddlex_serving as px  # noqa: E402
from bench_service import save_results  # noqa: E402

from loadtest import pages as page_maker  # noqa: E402
from tests.support import paddlex_reference as reference  # noqa: E402

VARIANTS = ("binding", "default", "1 thread")


def repository(tmp: Path, variant: str, pipeline: Path) -> Path:
    root = tmp / variant.replace(" ", "_")
    (root / px.MODEL).mkdir(parents=True)
    raw = yaml.safe_load(pipeline.read_text())
    if variant == "1 thread":
        for module in raw["SubModules"].values():
            module.setdefault("engine_config", {})["cpu_threads"] = 1
    (root / px.MODEL / "pipeline.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root


def start(variant: str, root: Path, tmp: Path, deadline_s: float) -> px.Process:
    flags = ("--no-predictor-runs-without-gil",) if variant == "binding" else ()
    return px.start_ours(root, tmp, deadline_s, tag=variant, flags=flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--pages", type=int, default=24)
    parser.add_argument("--deadline", type=float, default=300, help="seconds a service has to be ready")
    args = parser.parse_args()
    began = time.monotonic()
    px.say(f"Predictor runs with and without the GIL, {args.rounds} rounds, {args.pages} pages; {px.machine()}")
    datas = [p.data for p in page_maker.pages(args.pages)]
    figures = ("c1_p50_ms", "c1_mean_ms", "rps", "p50_ms")
    found = {v: {f: [] for f in figures} for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="predictor-runs-") as scratch:
        tmp = Path(scratch)
        pipeline = reference.pipeline_file(tmp)
        services: dict[str, px.Process] = {}
        try:
            for variant in VARIANTS:
                services[variant] = start(variant, repository(tmp, variant, pipeline), tmp, args.deadline)
            apis = {v: px.OcrApi(s.url, datas) for v, s in services.items()}
            truth, wrong, answered = {}, {v: 0 for v in VARIANTS}, {v: 0 for v in VARIANTS}
            for variant in VARIANTS:
                _, answers = px.sequential(apis[variant], len(datas), 1)
                truth = truth or {page: texts for page, texts in answers}
                px.concurrent(apis[variant], len(datas), args.clients, args.requests)
            px.say("warmed up")
            for number in range(args.rounds):
                order = VARIANTS[number % 3:] + VARIANTS[:number % 3]
                for variant in order:
                    latencies, answers = px.sequential(apis[variant], len(datas), 1)
                    rate, more, extra = px.concurrent(apis[variant], len(datas), args.clients, args.requests,
                                                      number * args.requests)
                    for key, value in (("c1_p50_ms", 1000 * statistics.median(latencies)),
                                       ("c1_mean_ms", 1000 * statistics.mean(latencies)),
                                       ("rps", rate), ("p50_ms", 1000 * statistics.median(more))):
                        found[variant][key].append(value)
                    wrong[variant] += px.mismatches(answers + extra, truth)
                    answered[variant] += len(answers) + len(extra)
                px.say(f"round {number + 1}/{args.rounds}: " + ", ".join(
                    f"{v} c=1 {found[v]['c1_p50_ms'][-1]:.0f} ms, {found[v]['rps'][-1]:.2f} req/s" for v in VARIANTS))
            resident = {v: s.resident_mib() for v, s in services.items()}
        except Exception:
            for log in sorted(tmp.glob("*.log")):
                print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        finally:
            for service in services.values():
                service.stop()
    labels = {"c1_p50_ms": "c=1 p50, ms", "c1_mean_ms": "c=1 mean, ms", "rps": f"{args.clients} clients, req/s",
              "p50_ms": f"{args.clients} clients p50, ms"}
    lines = ["| figure | " + " | ".join(VARIANTS) + " | default / binding | 1 thread / binding |",
             "|---|" + "---:|" * (len(VARIANTS) + 2)]
    for key, label in labels.items():
        cells = [px.spread(found[v][key], 1 if key.endswith("ms") else 2) for v in VARIANTS]
        ratios = [px.spread([a / b for a, b in zip(found[v][key], found["binding"][key])]) for v in VARIANTS[1:]]
        lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
    lines.append("| rec_texts differing from the binding's c=1 answer | "
                 + " | ".join(f"{wrong[v]} of {answered[v]}" for v in VARIANTS) + " | | |")
    lines.append("| resident memory at the end, MiB | " + " | ".join(f"{resident[v]:.0f}" for v in VARIANTS)
                 + " | | |")
    print()
    command = "python benchmarks/predictor_runs.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(f"{datetime.date.today()} {time.strftime('%H:%M')}, {px.machine()}\n\n    {command.strip()}\n")
    print("\n".join(lines))
    print(f"\n({time.monotonic() - began:.0f} s in all)")
    save_results("predictor_runs", args, found=found, wrong=wrong, answered=answered, resident_mib=resident)


if __name__ == "__main__":
    main()
