"""The service's command line and start-up, as a user meets them; each run is a fresh interpreter."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from servers import ServiceProcess

BIN = Path(sys.executable).parent
ENTRY_POINTS = {"placeenv-serve": [str(BIN / "placeenv-serve")],
                "python -m placeenv.serve": [sys.executable, "-m", "placeenv.serve"]}


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}


def _options(help_text: str) -> dict[str, str]:
    """argparse's option list: flag -> its description, without the '(default: ...)' it appends."""
    body = help_text.split("options:", 1)[1]
    entries = re.split(r"\n  (?=-)", "\n" + body)
    options = {}
    for entry in entries[1:]:
        flag = re.match(r"(--[\w-]+|-h)", entry)[1]
        text = " ".join(entry.split()[1:])
        text = re.sub(r"\(default: .*?\)$", "", re.sub(r"^(\{[^}]*\}|[A-Z_]+|str|int|float|bool)\s*", "", text))
        options[flag] = text.strip()
    return options


@pytest.mark.parametrize("program", ENTRY_POINTS)
def test_help_names_the_program_and_describes_every_flag_in_plain_text(program):
    result = subprocess.run([*ENTRY_POINTS[program], "--help"], capture_output=True, text=True, env=_env(),
                            timeout=60)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith(f"usage: {program} "), text[:200]
    options = _options(text)
    assert len(options) > 20 and "--port" in options and "--access-log" in options, sorted(options)
    undescribed = [flag for flag, description in options.items() if not description]
    assert not undescribed, undescribed
    for markup in ("``", ":class:", ":func:", "429"):
        assert markup not in text, markup


def test_a_port_in_use_is_refused_before_any_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run([*ENTRY_POINTS["placeenv-serve"], "--port", str(port), "--devices", "sim:0"],
                                capture_output=True, text=True, env=_env(), timeout=120)
        elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip() == (f"placeenv-serve: cannot listen on 127.0.0.1:{port}: Address already in use; "
                                     "choose another port with --port or PLACEENV_PORT"), result.stderr[-3000:]
    # Before the models: nothing was loaded or served (the old start-up logged "serving ..." first).
    assert "serving" not in result.stderr and "paddle" not in result.stderr.lower()
    print(f"refused in {elapsed:.2f} s")


def test_a_start_has_no_ccache_warning_and_no_access_log_by_default():
    with ServiceProcess(devices="sim:0") as service:
        assert httpx.get(f"{service.url}/healthz").status_code == 200
    output = service.output()
    assert "serving digits" in output  # the log was read
    assert "No ccache found" not in output
    assert '"GET /healthz HTTP/1.1" 200' not in output


def test_access_log_logs_each_request():
    with ServiceProcess(devices="sim:0", access_log="true") as service:
        assert httpx.get(f"{service.url}/healthz").status_code == 200
        time.sleep(0.2)
    assert '"GET /healthz HTTP/1.1" 200' in service.output()
