"""Isolation in the service: the leak checks of a real service process count leaks only without it.

The library's own isolation tests are in tests/library/test_isolation.py; these run the service.
The saved-program case below is why the service expects CPU outputs on sim devices.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import paddle
import pytest
from support import wait_until, where
from support.servers import ServiceProcess

import placeenv

SIM = {"sim:0", "sim:1", "sim:2", "sim:3"}
STAGES = ("load", "preprocess", "worker", "batch", "execute", "output")


def test_a_saved_program_on_sim_keeps_its_weights_there_and_returns_cpu_outputs():
    """Why the service expects CPU outputs from a saved program on sim (workers.py, Model.output_device):
    ``paddle.jit.load`` under sim:1 puts the parameters on sim:1, but the program's kernels are Paddle's
    CPU fallbacks on a custom device without them, so its outputs are CPU tensors."""
    from placeenv import PlaceEnv
    from placeenv.serve.models.examples import ensure_mobilenet, mobilenet_home

    ensure_mobilenet()  # the service builds it at its first start; this test may come first
    with PlaceEnv("sim:1"):
        layer = paddle.jit.load(str(mobilenet_home() / "1" / "model"))
        with paddle.no_grad():
            out = layer(paddle.to_tensor(np.zeros((2, 3, 32, 32), np.float32)))
    assert {placeenv.device_name(v.place) for v in layer.state_dict().values()} == {"sim:1"}
    assert where(out) == "cpu" and out.shape == [2, 10]


async def _mobilenet_load(url: str, clients: int, per_client: int) -> list[tuple[int, str]]:
    """(status, device) of every answer; ``clients`` concurrent senders of one-image requests."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def client(c: int):
            answers = []
            for i in range(per_client):
                image = np.full((3, 32, 32), ((c + i) % 7) / 7.0).tolist()
                r = await http.post("/predict", json={"model": "mobilenet", "inputs": [image]})
                answers.append((r.status_code, r.json().get("device", r.text)))  # device, or the error
            return answers

        return [a for answers in await asyncio.gather(*[client(c) for c in range(clients)]) for a in answers]


@pytest.mark.parametrize("frontends", [0, 1])
@pytest.mark.parametrize("isolation", ["on", "off"])
def test_repository_model_leaks_are_counted_only_without_isolation(isolation, frontends):
    """mobilenet is a plain ``paddle.jit.save`` directory (no model.py): served on 4 sim devices by 8
    workers under concurrent load, no check finds a leak with isolation on; with isolation off (stock
    Paddle: one process-wide device, each worker calling set_device before its batch) the leak counter
    climbs. The checks that see it are those of the thread's device:

    - 'worker' (before the forward) and 'execute' (after it): another worker's set_device, or a
      preprocessing thread's PlaceEnv('cpu'), moved the one global device under this worker;
    - 'load' (parameters after jit.load), at start, when another worker's set_device landed between
      this worker's and its load.

    The 'output' check cannot see it for a saved program on sim: the program runs on Paddle's
    CPU-fallback kernels and returns CPU tensors whatever device it ran on (the test above), so the
    expected output device is 'cpu' there and the check holds with or without isolation. 'batch' moves
    the inputs with an explicit place, and 'preprocess' expects the CPU, so neither sees it either.

    With a front end (``frontends=1``) the same holds: workers and preprocessing are threads of the
    engine process, where the checks run, and the front end's /metrics shows the engine's counts.
    """
    with ServiceProcess(MODELS="mobilenet", ISOLATION=isolation, FRONTENDS=frontends) as proc:
        at_start = proc.by_label("placeenv_device_leaks_total", "stage")
        answers = asyncio.run(_mobilenet_load(proc.url, clients=16, per_client=8))
        # With a front end, the engine's counts reach its /metrics within a quarter of a second.
        wait_until(lambda: proc.by_label("placeenv_place_checks_total", "stage").get("output", 0) >= 128 / 8, 10,
                   "the output checks were not counted")
        leaks = proc.by_label("placeenv_device_leaks_total", "stage")
        checks = proc.by_label("placeenv_place_checks_total", "stage")
    assert len(answers) == 128  # every request one answer
    served = [device for status, device in answers if status == 200]
    assert set(served) == SIM
    if isolation == "on":
        assert len(served) == 128, [a for a in answers if a[0] != 200][:3]
    else:
        # Stock Paddle may also fail a request outright: weights loaded onto another worker's device
        # ("The places of matrices in the matmul should be the same"), or a preprocessing thread that
        # found no Tracer because a worker's jit program had switched the one global Tracer to static
        # graph (its dygraph guard with no Tracer) and made a static Value. Each is that request's 500 and no more.
        failed = [a for a in answers if a[0] != 200]
        assert all(status == 500 and "failed" in detail for status, detail in failed), failed[:3]
    assert set(checks) == set(STAGES), checks  # every check ran, 'output' included
    assert checks["output"] >= 128 / 8 and checks["execute"] >= 128 / 8
    if isolation == "on":
        assert leaks == {}, leaks
        return
    climbed = {stage: leaks.get(stage, 0) - at_start.get(stage, 0) for stage in leaks}
    assert sum(climbed.values()) > 0, (at_start, leaks)  # the negative control: it climbs under load
    assert set(leaks) <= {"load", "worker", "execute"}, leaks
    assert {s for s, n in climbed.items() if n} <= {"worker", "execute"}, climbed  # 'load' is at start only
