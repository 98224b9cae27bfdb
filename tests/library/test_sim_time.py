"""Device time on sim devices: one timeline a device, devices in parallel, the host waiting inside Paddle.

Each scenario runs in a fresh interpreter whose plugin was loaded with device time on. Bounds are
ratios and lower bounds: a sleep never ends early, and a slow machine only adds host time, so the
lower bounds hold anywhere and the upper ones leave several times the host work needed here.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import paddle
import pytest

import placeenv
import placeenv.sim
from placeenv.tensors import move_to

T = 0.1  # seconds of device time a transfer in these scenarios

SCENARIOS = """
import json, threading, time
import numpy as np, paddle, placeenv, placeenv.sim
from placeenv.tensors import move_to

host = paddle.to_tensor(np.ones((4, 64), np.float32), place=paddle.CPUPlace())
places = [placeenv.to_place(f"sim:{i}") for i in range(2)]
for place in places:
    move_to(host, place)  # the first copy to a device sets up its allocator and stream

def copies(place, n=3):
    for _ in range(n):
        move_to(host, place)  # a blocking host-to-device copy: what a worker does with its inputs

def timed(*targets):
    errors = []

    def guarded(target):
        try:
            target()
        except BaseException as exc:  # re-raised below: a thread's failure fails the scenario
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start

out = {}
before = placeenv.sim.stats(1)
out["one thread"] = timed(lambda: copies(places[1]))
after = placeenv.sim.stats(1)
out["counted"] = [after.transfers - before.transfers, after.device_seconds - before.device_seconds,
                  after.waits - before.waits]
out["same device"] = timed(lambda: copies(places[1]), lambda: copies(places[1]))
out["two devices"] = timed(lambda: copies(places[0]), lambda: copies(places[1]))

start = time.perf_counter()
for _ in range(5):
    host.to("sim:0", blocking=False)  # queued on sim:0's timeline, returns at once
out["queueing"] = time.perf_counter() - start
start = time.perf_counter()
move_to(host, places[1])
out["sim:1 behind sim:0's queue"] = time.perf_counter() - start
start = time.perf_counter()
paddle.device.synchronize("sim:0")
out["sim:0 synchronize"] = time.perf_counter() - start
print(json.dumps(out))
"""


def scenarios(sim_run, transfer_us: int) -> dict:
    return sim_run(SCENARIOS, devices=2, env={"PLACEENV_SIM_TRANSFER_US": str(transfer_us)}).json()


@pytest.fixture(scope="module")
def timed():
    from placeenv.testing import run_with_sim

    return scenarios(run_with_sim, int(T * 1e6))


def test_the_host_waits_for_each_transfer_inside_paddle(timed):
    assert timed["one thread"] >= 3 * T * 0.99
    transfers, device_seconds, waits = timed["counted"]
    assert transfers == 3 and waits == 3
    assert device_seconds == pytest.approx(3 * T)


def test_one_device_runs_its_work_one_item_after_another(timed):
    # Two threads, six copies, one timeline: never faster than six transfers one after another.
    assert timed["same device"] >= 6 * T * 0.99
    assert timed["same device"] >= 1.6 * timed["one thread"]


def test_two_devices_run_in_parallel(timed):
    # The same six copies on two devices: about the time of three (ideal ratio 0.5).
    assert timed["two devices"] >= 3 * T * 0.99
    assert timed["two devices"] <= 0.75 * timed["same device"], timed


def test_a_wait_on_one_device_does_not_delay_another(timed):
    # One transfer as this machine runs it, T and the host's own cost: the copies of "one thread",
    # one after another, measured in the same run.
    transfer = timed["one thread"] / 3
    assert timed["queueing"] < 2 * transfer, "asynchronous copies return before their device time"
    # sim:0 holds 5 T of queued work; a copy to sim:1 waits for its own transfer only.
    assert T * 0.99 <= timed["sim:1 behind sim:0's queue"] < 2.5 * transfer, timed
    # ...and sim:0's work was still queued: its synchronize waits for the rest of it.
    assert timed["sim:0 synchronize"] >= 5 * T - timed["queueing"] - timed["sim:1 behind sim:0's queue"] - T


def test_the_per_byte_term_charges_by_size(sim_run):
    out = sim_run(
        """
        import json, time, numpy as np, paddle, placeenv.sim
        from placeenv.tensors import move_to
        place = paddle.CustomPlace("sim", 0)
        small = paddle.to_tensor(np.ones(16, np.float32), place=paddle.CPUPlace())
        large = paddle.to_tensor(np.ones(1 << 18, np.float32), place=paddle.CPUPlace())  # 1 MiB
        move_to(small, place)
        def took(tensor):
            start = time.perf_counter(); move_to(tensor, place); return time.perf_counter() - start
        print(json.dumps({"small": took(small), "large": took(large)}))
        """,
        devices=1, env={"PLACEENV_SIM_GBPS": "0.01"},  # 10 MB/s: 1 MiB takes 0.105 s
    ).json()
    assert out["large"] >= 0.104
    assert out["small"] < 0.5 * out["large"]


def test_device_time_is_off_by_default():
    """This session's plugin has no device time: transfers are counted and cost nothing."""
    before = placeenv.sim.stats(1)
    host = paddle.to_tensor(np.ones((4, 64), np.float32), place=paddle.CPUPlace())
    for _ in range(3):
        move_to(host, placeenv.to_place("sim:1"))
    after = placeenv.sim.stats(1)
    assert after.transfers - before.transfers >= 3  # (other threads of this session may copy too)
    assert after.bytes - before.bytes >= 3 * 4 * 64 * 4
    assert after.device_seconds == before.device_seconds == 0
    assert after.waits == before.waits


def test_negative_control_without_device_time_nothing_waits(sim_run):
    """The same scenarios with device time off: the bounds above would all fail."""
    untimed = scenarios(sim_run, 0)
    assert untimed["same device"] < 6 * T * 0.99
    assert untimed["counted"][1] == 0


def test_env_cli_prints_the_device_time_settings():
    run = [sys.executable, "-m", "placeenv.sim", "env", "--devices", "2"]
    out = subprocess.run([*run, "--transfer-us", "2000", "--gbps", "12.5"], capture_output=True, text=True,
                         check=True).stdout
    assert "export PLACEENV_SIM_TRANSFER_US=2000\n" in out and "export PLACEENV_SIM_GBPS=12.5\n" in out
    bad = subprocess.run([*run, "--transfer-us", "-5"], capture_output=True, text=True)
    assert bad.returncode == 1 and "PLACEENV_SIM_TRANSFER_US is a number of µs, 0 (off) or from" in bad.stderr


def test_stats_names_a_device_that_is_not_there():
    with pytest.raises(placeenv.sim.SimSetupError, match="no sim:9 in this process"):
        placeenv.sim.stats(9)
