"""pytest plugin (auto-loaded through the ``pytest11`` entry point ``placeenv``): the ``sim_run`` fixture.

pytest imports this module at start-up in every environment where placeenv is
installed, including projects that never use placeenv. So it imports neither
``placeenv`` nor ``paddle``: ``import placeenv`` arms the install into Paddle,
and a session that has not asked for placeenv must run on stock Paddle. The
fixture imports ``placeenv.testing`` only when a test uses it.

Isolation claims that depend on import order, on a fresh Paddle, or on the
number of devices need their own process::

    def test_two_devices(sim_run):
        out = sim_run("import paddle; print(paddle.device.get_available_device())", devices=2)
        assert "sim:1" in out.stdout
"""

from __future__ import annotations

import pytest


@pytest.fixture
def sim_run():
    """``sim_run(code, devices=4, env=None, check=True)`` -> SimResult: ``code`` in a fresh interpreter
    with ``devices`` sim devices (see ``placeenv.testing.run_with_sim``)."""
    from placeenv.testing import run_with_sim

    return run_with_sim
