"""Triton's perf_analyzer against the service: digits over gRPC and HTTP, concurrency 1 to 16.

    python benchmarks/perf_analyzer.py [--devices 2] [--concurrency 1,2,4,8,16] [--requests 300]

perf_analyzer (tritonclient 2.40.0's binary: tests/support/perf_analyzer.py fetches it; it needs
Debian's libb64-0d and the nvidia-cuda-runtime-cu12 wheel of the dev extra) sends synchronous
requests of one example, real digits, from as many threads as the concurrency, in windows of
``--requests`` requests until three agree within 50%. One service process (sim devices, one
worker each, digits) serves both protocols. Prints a Markdown table: throughput, the client's p50
and p99, and the server's side read by perf_analyzer from the service's statistics (the average
request's time in the queue and in each compute stage, and the examples per forward pass);
writes ``results/perf_analyzer.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import save_results, service  # noqa: E402
from support import perf_analyzer  # noqa: E402

from placeenv.serve.models.train_digits import held_out_split  # noqa: E402
from placeenv.testing import free_port  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=2, help="sim devices, one worker each")
    parser.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated concurrency levels")
    parser.add_argument("--requests", type=int, default=300, help="requests per measurement window")
    parser.add_argument("--protocols", default="grpc,http")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    x, _ = held_out_split()
    found = []
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "digits.json"
        data.write_text(json.dumps({"data": [{"pixels": {"content": [float(v) for v in x[i]], "shape": [64]}}
                                             for i in range(64)]}))
        grpc_port = free_port()
        server = service([f"sim:{i}" for i in range(args.devices)], "digits", GRPC_PORT=grpc_port)
        try:
            for protocol in args.protocols.split(","):
                url = f"127.0.0.1:{grpc_port}" if protocol == "grpc" else f"127.0.0.1:{server.port}"
                for level in levels:
                    csv_file = Path(scratch) / f"{protocol}-{level}.csv"
                    done = perf_analyzer.run(
                        ["-m", "digits", "-u", url, "-i", protocol, "--input-data", str(data),
                         "--concurrency-range", f"{level}:{level}", "--measurement-mode", "count_windows",
                         "--measurement-request-count", str(args.requests), "-s", "50", "-f", str(csv_file)])
                    if done.returncode != 0:
                        raise SystemExit(f"perf_analyzer failed ({protocol}, concurrency {level}):\n"
                                         f"{done.stdout[-3000:]}")
                    printed = perf_analyzer.report(done.stdout)[level]
                    row = perf_analyzer.rows(csv_file)[level]
                    found.append({
                        "protocol": protocol, "concurrency": level, "throughput": row["Inferences/Second"],
                        "p50_ms": row["p50 latency"] / 1000, "p99_ms": row["p99 latency"] / 1000,
                        **{key: printed[key] for key in ("queue_us", "compute_input_us", "compute_infer_us",
                                                         "compute_output_us", "latency_us")},
                        "batch": printed["inference_count"] / printed["execution_count"],
                    })
                    print(f"{protocol} c={level}: {row['Inferences/Second']:.0f} infer/s", file=sys.stderr)
        finally:
            server.stop()
    print(f"\n{args.devices} sim devices x 1 worker, digits, perf_analyzer {perf_analyzer.VERSION}, "
          f"{platform.machine()}:\n")
    print("| protocol | concurrency | infer/s | p50 ms | p99 ms | server: request us | queue us | "
          "compute input us | compute infer us | compute output us | examples per forward pass |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in found:
        print(f"| {r['protocol']} | {r['concurrency']} | {r['throughput']:.0f} | {r['p50_ms']:.2f} | "
              f"{r['p99_ms']:.2f} | {r['latency_us']:.0f} | {r['queue_us']:.0f} | {r['compute_input_us']:.0f} | "
              f"{r['compute_infer_us']:.0f} | {r['compute_output_us']:.0f} | {r['batch']:.2f} |")
    print(f"\nwrote {save_results('perf_analyzer', args, machine=platform.machine(), rows=found)}")


if __name__ == "__main__":
    main()
