"""Which of Paddle's calls on a worker's request path hold the GIL while the device works.

    python benchmarks/gil_probe.py [--transfer-us 20000] [--rounds 3] [--seconds 1]

Sim devices with device time (``placeenv.sim``, ``--transfer-us`` a transfer): the host's wait
happens inside Paddle's own call, as on a GPU, by a sleep that costs no CPU. For each call a
worker makes (both backends), the main thread runs it in a loop on ``sim:1`` while a second
thread spins in Python and counts. The spinner's speed against its speed alone (measured just
before) says what the call does with the GIL during its device wait:

    the spinner runs through the waits     the GIL is released while the device works
    the spinner stops during the waits     the GIL is held: every other Python thread stops

Its speed beyond the time outside the waits is the share of the waits it ran (the table's
"spinner's share of the waits"): released where that is over half.

The wait share is the plugin's own figure (host wait time over the loop's time). Rounds are
interleaved (each round runs every call once); the table gives the median and the spread.
A tiny program (``Linear(64, 10)``, saved with ``paddle.jit.save``) keeps the host work small.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transfer-us", type=int, default=20000, help="device time of each transfer (µs)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="each call's loop, per round")
    args = parser.parse_args()

    import placeenv.sim
    placeenv.sim.prepare(devices=2, transfer_us=args.transfer_us)
    import numpy as np
    import paddle

    import placeenv
    from placeenv.tensors import move_to

    paddle.set_device("cpu")
    folder = Path(tempfile.mkdtemp(prefix="gil-probe-"))
    paddle.jit.save(paddle.nn.Linear(64, 10), str(folder / "model"),
                    input_spec=[paddle.static.InputSpec([None, 64], "float32", "x")])
    paddle.set_device("sim:1")
    place = placeenv.to_place("sim:1")
    layer = paddle.jit.load(str(folder / "model"))
    layer.eval()
    config = paddle.inference.Config(str(folder / "model.json"), str(folder / "model.pdiparams"))
    config.enable_custom_device("sim", 1)
    config.disable_glog_info()
    predictor = paddle.inference.create_predictor(config)
    x = np.ones((1, 64), np.float32)
    host = paddle.to_tensor(x, place=paddle.CPUPlace())
    on_device = move_to(host, place)
    feed = predictor.get_input_handle(predictor.get_input_names()[0])
    fetch = predictor.get_output_handle(predictor.get_output_names()[0])
    event = paddle.device.Event()

    def forward():
        with paddle.no_grad():
            return layer(on_device)

    def queue_then(wait):
        """An asynchronous host-to-device copy queues device work; ``wait`` then waits for it."""
        def call():
            for _ in range(3):
                host.to(place, blocking=False)
            wait()
        return call

    def zero_copy_run():
        feed.reshape([1, 64])
        feed.copy_from_cpu(x)
        predictor.run()
        fetch.copy_to_cpu()

    def record_and_wait():
        event.record()
        event.synchronize()

    calls = {
        "H2D copy: move_to(host, sim) (both backends' inputs)": lambda: move_to(host, place),
        "H2D copy: paddle.to_tensor(array, place=sim)": lambda: paddle.to_tensor(x, place=place),
        "jit: forward of the jit.load'ed layer": forward,
        "jit: forward + Tensor.numpy() (outputs are CPU on sim)": lambda: forward().numpy(),
        "D2H copy: Tensor.numpy() of a sim tensor": lambda: on_device.numpy(),
        "inference: Predictor.run([sim tensor])": lambda: predictor.run([on_device]),
        "inference: copy_from_cpu + run() + copy_to_cpu": zero_copy_run,
        "inference: copy_from_cpu alone": lambda: feed.copy_from_cpu(x),
        "inference: copy_to_cpu alone": lambda: fetch.copy_to_cpu(),
        "paddle.device.synchronize() after queued work": queue_then(paddle.device.synchronize),
        "Stream.synchronize() after queued work": queue_then(lambda: paddle.device.current_stream().synchronize()),
        "Event.record + Event.synchronize() after queued work": queue_then(record_and_wait),
    }
    zero_copy_run()  # shapes the handles, so the lone copies have something to copy

    def spin(stop: threading.Event, counts: list[int]) -> None:
        n = 0
        while not stop.is_set():
            n += 1
        counts.append(n)

    def spinner_rate(call, seconds: float) -> tuple[float, float, float, int]:
        """(spinner iterations/s, wait share, ms a call, transfers a call) while ``call`` loops."""
        before = placeenv.sim.stats(1)
        stop, counts = threading.Event(), []
        thread = threading.Thread(target=spin, args=(stop, counts))
        thread.start()
        started = time.perf_counter()
        calls_made = 0
        while time.perf_counter() - started < seconds:
            if call is not None:
                call()
            else:
                time.sleep(0.01)
            calls_made += 1
        elapsed = time.perf_counter() - started
        stop.set()
        thread.join()
        after = placeenv.sim.stats(1)
        share = (after.wait_seconds - before.wait_seconds) / elapsed
        return (counts[0] / elapsed, share, elapsed / calls_made * 1e3,
                round((after.transfers - before.transfers) / calls_made))

    for call in calls.values():  # warm every path once
        call()
    # The spinner's speed alone is measured right before each call's loop: this VM's speed drifts by
    # 2x within a minute, and a call's figure is its spinner against the spinner of that moment.
    idle, rows = [], {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            idle.append(spinner_rate(None, args.seconds / 2)[0])
            rate, share, ms, transfers = spinner_rate(call, args.seconds)
            rows[name].append((rate / idle[-1], share, ms, transfers))

    print(f"sim device time {args.transfer_us} µs a transfer; spinner alone {statistics.median(idle) / 1e6:.1f} M/s "
          f"({min(idle) / 1e6:.1f}..{max(idle) / 1e6:.1f}); {args.rounds} interleaved rounds of "
          f"{args.seconds:g} s a call\n")
    print("| call | ms a call | transfers a call | host waits for the device | spinner's speed | "
          "spinner's share of the waits | the GIL while the device works |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, results in rows.items():
        speeds = [r[0] for r in results]
        shares = [r[1] for r in results]
        speed, share = statistics.median(speeds), statistics.median(shares)
        # The spinner runs at most all of the time outside the waits; what it ran beyond that, it ran
        # during the waits: about all of them where the call lets the GIL go, none where it holds it.
        during = [(v - (1 - w)) / w if w >= 0.2 else float("nan") for v, w in zip(speeds, shares)]
        if share < 0.2:
            verdict, ran = "no device wait in this call on sim", "-"
        else:
            ran = f"{statistics.median(during):.0%}"
            verdict = "released" if statistics.median(during) >= 0.5 else "**held**"
        print(f"| {name} | {statistics.median(r[2] for r in results):.1f} | {results[0][3]} | "
              f"{share:.0%} | {speed:.0%} ({min(speeds):.0%}..{max(speeds):.0%}) | {ran} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
