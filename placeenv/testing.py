"""pytest plugin (auto-loaded): run code in a fresh interpreter that has sim devices.

Isolation claims that depend on import order, on a fresh Paddle, or on the
number of devices need their own process::

    def test_two_devices(sim_run):
        out = sim_run("import paddle; print(paddle.device.get_available_device())", devices=2)
        assert "sim:1" in out.stdout

Nothing here imports Paddle, so loading the plugin never fixes the order of
imports for the test session itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest


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


@pytest.fixture
def sim_run():
    """``sim_run(code, devices=4, env=None, check=True)`` -> SimResult (fresh interpreter)."""
    return run_with_sim
