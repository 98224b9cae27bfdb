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

from support import wait_until
from support.servers import ServiceProcess

from placeenv.serve.config import STACKS

BIN = Path(sys.executable).parent
ENTRY_POINTS = {"placeenv-serve": [str(BIN / "placeenv-serve")],
                "python -m placeenv.serve": [sys.executable, "-m", "placeenv.serve"]}


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}


def _options(help_text: str) -> dict[str, str]:
    """argparse's option list: flag -> its description, without the '(default: ...) [env: ...]' appended."""
    body = help_text.split("options:", 1)[1]
    entries = re.split(r"\n  (?=-)", "\n" + body)
    options = {}
    for entry in entries[1:]:
        flag = re.match(r"(--[\w-]+|-h)", entry)[1]
        text = " ".join(entry.split()[1:])
        # The metavar, or a yes/no flag's --no-x.
        text = re.sub(r"^(--no-[\w-]+|\{[^}]*\}|[A-Z_]+|str|int|float|bool)\s*", "", text)
        text = re.sub(r"\(default: .*?\)( \[env: [A-Z_]+\])?$", "", text)
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
    # A yes/no setting is a bare flag: "--access-log", not "--access-log true".
    assert "[--access-log | --no-access-log]" in text
    # Each flag names its variable; the first are where to listen.
    assert re.search(r"\(default: 8000\)\s+\[env: PLACEENV_PORT\]", text)
    assert list(options)[1:4] == ["--host", "--port", "--grpc-port"]


def test_sim_help_is_plain_and_names_the_python_to_run_it_with():
    texts = {}
    for command in ("", "env", "build"):
        result = subprocess.run([sys.executable, "-m", "placeenv.sim", *command.split(), "--help"],
                                capture_output=True, text=True, env=_env(), timeout=60)
        assert result.returncode == 0, result.stderr
        texts[command] = text = " ".join(result.stdout.split())
        assert text.startswith(" ".join(["usage: python -m placeenv.sim", *command.split(), "[-h]"])), text
        assert "``" not in text and ":class:" not in text
        # The usual mistake is another Python, where placeenv or Paddle is missing.
        assert 'eval "$(.venv/bin/python -m placeenv.sim env --devices 4)"' in text, text
    assert "--devices N how many sim devices, 1 to 64 (default: 4)" in texts["env"]


def test_access_log_is_a_bare_flag_and_an_environment_variable():
    code = ("from placeenv.serve.config import Settings; "
            "print(Settings(_cli_parse_args=['--access-log']).access_log, "
            "Settings(_cli_parse_args=[]).access_log)")
    flag = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(),
                          timeout=60)
    assert flag.stdout.split() == ["True", "False"], flag.stderr
    code = "from placeenv.serve.config import Settings; print(Settings(_cli_parse_args=[]).access_log)"
    env = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**_env(), "PLACEENV_ACCESS_LOG": "true"}, timeout=60)
    assert env.stdout.split() == ["True"], env.stderr


def test_a_port_in_use_is_refused_before_any_model_loads():
    # What the command's own start costs on this machine: --help imports the command line and its
    # settings, as a refused start does, and loads nothing.
    started = time.monotonic()
    helped = subprocess.run([*ENTRY_POINTS["placeenv-serve"], "--help"], capture_output=True, text=True,
                            env=_env(), timeout=120)
    help_s = time.monotonic() - started
    assert helped.returncode == 0, helped.stderr[-3000:]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run([*ENTRY_POINTS["placeenv-serve"], "--port", str(port), "--devices", "sim:0"],
                                capture_output=True, text=True, env=_env(), timeout=120)
        elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr[-3000:]
    # One line and nothing else: no traceback, and nothing loaded or served (the old start-up
    # imported Paddle, loaded the models and logged "serving ..." first).
    message = (f"placeenv-serve: cannot listen on 127.0.0.1:{port}: the port is already in use (another "
               "server?); choose another with --port or PLACEENV_PORT")
    assert result.stderr.strip() == message, result.stderr[-3000:]
    # A hang guard, within three times what --help took and a second for a busy machine's stalls
    # (the lone line above is what shows nothing loaded).
    assert elapsed < 3 * help_s + 1, (elapsed, help_s)
    print(f"refused in {elapsed:.2f} s (--help {help_s:.2f} s)")


def test_a_grpc_port_in_use_is_refused_before_any_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([*ENTRY_POINTS["python -m placeenv.serve"], "--port", "0",
                                 "--grpc-port", str(port), "--devices", "sim:0"],
                                capture_output=True, text=True, env=_env(), timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    message = (f"python -m placeenv.serve: cannot listen on 127.0.0.1:{port}: the port is already in use "
               "(another server?); choose another with --grpc-port or PLACEENV_GRPC_PORT")
    assert result.stderr.strip() == message, result.stderr[-3000:]


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
        wait_until(lambda: '"GET /healthz HTTP/1.1" 200' in service.output(), 10, "no access log line")
    assert '"GET /healthz HTTP/1.1" 200' in service.output()


@pytest.mark.parametrize("frontends", [0, 1])
def test_a_service_prints_its_threads_stacks_on_sigusr2_and_serves_on(frontends):
    # Without the handler, SIGUSR2's default action ends the process: the readiness check after it fails.
    with ServiceProcess(devices="sim:0", frontends=frontends) as service:
        service.proc.send_signal(STACKS)
        wait_until(lambda: "most recent call first" in service.output(), 30, lambda: f"no stacks:\n{service.output()}")
        assert service.ready(), service.output()
        assert f"placeenv{os.sep}serve{os.sep}" in service.output().split("most recent call first", 1)[1]


# A fresh interpreter: the settings of a service process, then Paddle's first parallel region, then what
# Paddle's OpenMP runtime took (kmp_get_blocktime): the value must be in place before the runtime starts.
BLOCKTIME_PROGRAM = """
import ctypes, os, sys
from placeenv.serve.config import Settings
if sys.argv[1] == "service":
    Settings().set_up_process()
import paddle
paddle.matmul(paddle.ones([64, 64]), paddle.ones([64, 64]))
runtime = ctypes.CDLL(os.path.join(os.path.dirname(paddle.__file__), "libs", "libiomp5.so"))
print("blocktime", runtime.kmp_get_blocktime())
"""


@pytest.mark.parametrize("process, preset, expected", [
    ("service", None, 1),     # the setting's default
    ("service", "7", 7),      # the environment's own KMP_BLOCKTIME wins
    ("plain", None, 200),     # the control: OpenMP's default, in a program that is not the service
])
def test_a_service_process_shortens_openmps_spin_before_paddle_starts_it(process, preset, expected):
    env = {k: v for k, v in _env().items() if k != "KMP_BLOCKTIME"}
    if preset is not None:
        env["KMP_BLOCKTIME"] = preset
    found = subprocess.run([sys.executable, "-c", BLOCKTIME_PROGRAM, process], env=env, capture_output=True,
                           text=True, timeout=300)
    assert found.returncode == 0, found.stderr[-2000:]
    assert f"blocktime {expected}" in found.stdout.splitlines(), found.stdout[-500:]


# A fresh interpreter: the settings of a service process, then, on a thread of its own as a worker is, a
# 48 MiB block written, freed, and taken again: the minor page faults of writing it the second time.
# Kept, the pages are the process's still; handed back to the kernel, each is faulted in anew.
REUSE_PROGRAM = """
import ctypes, resource, sys, threading
from placeenv.serve.config import Settings
if sys.argv[1] == "service":
    Settings().set_up_process()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
SIZE = 48 << 20
found = []
def work():
    block = libc.malloc(SIZE); ctypes.memset(block, 1, SIZE); libc.free(block)
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    block = libc.malloc(SIZE); ctypes.memset(block, 2, SIZE)
    found.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    libc.free(block)
thread = threading.Thread(target=work)
thread.start(); thread.join()
print("faults", found[0])
"""


@pytest.mark.parametrize("process, settings, preset, kept", [
    ("service", {"KEEP_HOST_BLOCK_MIB": "64"}, None, True),  # kept: blocks up to 64 MiB
    ("service", {}, None, False),            # the defaults: blocks up to 4 MiB kept, a 48 MiB one given back
    ("service", {"KEEP_HOST_BLOCK_MIB": "64", "KEEP_HOST_MEMORY": "false"}, None, False),  # off: glibc's defaults
    ("service", {"KEEP_HOST_BLOCK_MIB": "64"}, {"MALLOC_MMAP_THRESHOLD_": "131072"}, False),  # the environment wins
    ("plain", {}, None, False),              # the control: a program that is not the service
])
def test_a_service_process_keeps_the_memory_it_frees(process, settings, preset, kept):
    env = {k: v for k, v in _env().items() if not k.startswith(("MALLOC_", "PLACEENV_KEEP_HOST_"))}
    env.update({f"PLACEENV_{name}": value for name, value in settings.items()})
    env.update(preset or {})
    found = subprocess.run([sys.executable, "-c", REUSE_PROGRAM, process], env=env, capture_output=True,
                           text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    faults = int(found.stdout.split()[-1])
    pages = (48 << 20) // os.sysconf("SC_PAGE_SIZE")
    # Transparent huge pages fault a 2 MiB page at a time: a block handed back still takes dozens.
    assert (faults < 16) if kept else (faults >= 16), (faults, pages)
