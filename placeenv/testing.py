"""Test helpers: run code in a fresh interpreter that has sim devices, count misplaced tensors.

Not a pytest plugin: the ``sim_run`` fixture lives in the top-level module
``pytest_placeenv`` (entry point ``pytest11``), which imports this module only
when a test uses the fixture. Nothing here imports pytest, and nothing imports
Paddle at module level.

``run_with_sim(code, devices=4)`` runs ``code`` with ``python -c`` in a new
interpreter whose Paddle has ``sim:0..devices-1``; ``count_wrong_places`` is
the leak count behind the isolation tests and ``benchmarks/leaks.py``;
``free_port`` is the one the tests and the benchmarks start their servers on.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count_wrong_places(devices, iterations: int, timeout: float = 120) -> dict[str, int]:
    """One thread per device: ``set_device(device)``, then ``iterations`` tensors made on each of
    Paddle's two paths; how many landed elsewhere, per path.

    The Python path is ``paddle.ones`` (Paddle's Python-level current device); the C++
    path is ``paddle.Tensor(ndarray)`` (the Tracer's expected place). Used by
    the isolation tests and ``benchmarks/leaks.py``. A thread's error is re-raised.
    """
    import numpy as np
    import paddle

    from .places import device_name

    counts, errors, lock = {"python": 0, "cpp": 0}, [], threading.Lock()

    def worker(device: str) -> None:
        try:
            paddle.set_device(device)
            python = cpp = 0
            for _ in range(iterations):
                python += device_name(paddle.ones([2]).place) != device
                cpp += device_name(paddle.Tensor(np.ones(2, "float32")).place) != device
            with lock:
                counts["python"] += python
                counts["cpp"] += cpp
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(device,)) for device in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"a leak-counting thread did not finish in {timeout} s")
    if errors:
        raise errors[0]
    return counts


def resident_bytes() -> int:
    """This process's resident memory (VmRSS, Linux), after a full garbage collection."""
    gc.collect()
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def live_private_tracers() -> int:
    """The private Tracers still alive after a full garbage collection (placeenv.state)."""
    from . import state

    gc.collect()
    return state.private_tracers()


@dataclass
class SimResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self):
        """The last line of stdout, parsed as JSON (scripts print their findings there)."""
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        if not lines:
            raise AssertionError(f"no output; stderr:\n{self.stderr[-3000:]}")
        return json.loads(lines[-1])


def run_with_sim(code: str, devices: int = 4, env: dict | None = None, timeout: float = 240,
                 check: bool = True, prepare: bool = True) -> SimResult:
    """Run ``code`` with ``python -c`` in a new interpreter with ``devices`` sim devices."""
    from placeenv import sim

    full_env = dict(os.environ)
    if prepare:
        full_env.update(sim.environment(devices))
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )
    result = SimResult(proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return result
