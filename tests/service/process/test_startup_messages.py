"""What a start prints: the line that says where the service listens, and not Paddle's ccache warning.

* Once ready, the service prints ``placeenv.serve: ready on http://HOST:PORT (API docs: .../docs)``,
  with the gRPC address when served; a start that fails never prints it.
* ``import placeenv; import paddle`` prints no "No ccache found" warning (placeenv's import hook
  hides that one warning while it imports Paddle), leaves no filter behind for it, and keeps the
  filters Paddle's own import adds; ``import paddle`` alone still prints it (the control).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support import wait_until
from support.servers import ServiceProcess, free_port

CCACHE = "No ccache found"


def _wait_for(service: ServiceProcess, text: str, timeout: float = 30) -> str:
    return wait_until(lambda: text in service.output() and service.output(), timeout,
                      lambda: f"{text!r} not printed:\n{service.output()[-3000:]}")


def test_a_started_service_says_where_it_listens_http_and_grpc():
    grpc_port = free_port()
    with ServiceProcess(devices="cpu", workers_per_device=1, grpc_port=grpc_port) as service:
        url = f"http://127.0.0.1:{service.port}"
        output = _wait_for(service, "placeenv.serve: ready on")
    line = f"placeenv.serve: ready on {url} (API docs: {url}/docs); gRPC on 127.0.0.1:{grpc_port}\n"
    assert line in output, output[-3000:]
    assert output.count("placeenv.serve: ready on") == 1


def test_control_a_start_that_fails_does_not_say_ready():
    service = ServiceProcess(devices="cpu", workers_per_device=1, models="no-such-model")
    try:
        assert service.proc.wait(120) != 0
    finally:
        service.kill()
    output = service.output()
    assert "no-such-model" in output and "ready on" not in output, output[-3000:]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PLACEENV_", "PYTHONWARNINGS"))}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(shutil.which("ccache") is not None, reason="Paddle warns only where ccache is missing")
def test_import_placeenv_then_paddle_prints_no_ccache_warning_and_leaves_other_filters():
    control = _python("import paddle")
    assert control.returncode == 0 and CCACHE in control.stderr, control.stderr[-3000:]

    found = _python(
        "import warnings\n"
        "import placeenv, paddle\n"
        "print(sum('numpy.ndarray size changed' in str(f[1]) for f in warnings.filters))\n"
        # a later ccache warning from that module still shows: no filter was left behind
        f"warnings.warn_explicit({CCACHE!r}, UserWarning, 'x.py', 1, "
        "module='paddle.utils.cpp_extension.extension_utils')\n"
    )
    assert found.returncode == 0, found.stderr[-3000:]
    assert found.stdout.strip() == "1"  # the filter Paddle's import adds is kept
    assert found.stderr.count(CCACHE) == 1 and "x.py:1" in found.stderr, found.stderr[-3000:]
