"""Test session set-up: 4 sim devices before Paddle is imported, placeenv installed.

Every test runs real Paddle on real (simulated) devices. Fixtures give each
test the patched state (default) or stock Paddle (negative controls).

The tests live in three rooms, and each test is marked with its room's name
(markers registered in pyproject.toml):

- ``library/``: placeenv itself (``pytest tests/library`` or ``-m library``);
- ``service/``: the inference service, in process and as one real uvicorn process;
- ``e2e/``: Docker, nginx, Prometheus, Locust, Kubernetes files, packaging
  (``-m "not e2e"`` leaves them out).

Shared helpers are in ``support/`` (``from support import run_threads, wait_until``).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import placeenv.sim

placeenv.sim.prepare(devices=4, transfer_us=0, gbps=0)  # no device time, whatever the shell exports

import httpx  # noqa: E402
import paddle  # noqa: E402
import pytest  # noqa: E402

import placeenv  # noqa: E402

# httpx's implicit 5 s deadline on every call that names none (httpx.get, Client() ...), as the one object
# those calls take by default: a route on a service under load (a model's reload, the first /docs) meets
# it on this machine and misses it on one 4x slower beside a busy loop. The tests' own timeouts stay.
httpx._config.DEFAULT_TIMEOUT_CONFIG.__init__(60.0)

# httpx builds an SSL context for every client, and every httpx.get or post is a client of its own, each parsing
# certifi's bundle again: the tests' polling loops spent much of their CPU on it (docs/benchmarks.md, "The suite's
# CPU, a second pass"). The tests' traffic is plain HTTP on 127.0.0.1, and a client that asks for the default
# verification gets one context, made once; any other is httpx's own.
_create_ssl_context = httpx._transports.default.create_ssl_context
_default_ssl_context = functools.cache(_create_ssl_context)


def _ssl_context(verify=True, cert=None, trust_env=True):
    if verify is True and cert is None and trust_env is True:
        return _default_ssl_context()
    return _create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)


httpx._transports.default.create_ssl_context = _ssl_context

ROOMS = ("library", "service", "e2e")
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Each test gets its room's marker (the folder under tests/ it lives in)."""
    for item in items:
        try:
            room = item.path.resolve().relative_to(HERE).parts[0]
        except ValueError:
            continue
        if room in ROOMS:
            item.add_marker(room)


@pytest.fixture(autouse=True)
def _fresh_state():
    """Each test starts installed, on the main thread's default device sim:0."""
    placeenv.install()
    paddle.set_device("sim:0")
    yield
    placeenv.install()
    paddle.set_device("sim:0")


@pytest.fixture
def stock():
    """Stock Paddle for the duration of the test (the negative control)."""
    placeenv.uninstall()
    yield
    placeenv.install()


@pytest.fixture(params=["placeenv", "stock"])
def mode(request):
    """Run a check twice: with placeenv (must pass) and on stock Paddle (must catch leaks)."""
    if request.param == "stock":
        placeenv.uninstall()
    yield request.param
    placeenv.install()


@pytest.fixture
def fast_switching():
    """Let the GIL switch threads every microsecond, so races happen within a short test."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)
