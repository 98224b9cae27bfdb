"""Packaging: what the wheel holds and requires, a pytest plugin without side effects, and the
library without the service stack.

* The wheel built from this repository has two top-level names, ``placeenv`` and
  ``pytest_placeenv``; it requires ``paddlepaddle`` and ``numpy`` only, and the
  service stack comes with the ``service`` extra.
* pytest loads the plugin wherever placeenv is installed, so loading it must leave
  Paddle stock: a throw-away pytest project that never imports placeenv sees stock
  Paddle (and the same project with ``import placeenv`` in its conftest does not).
* ``import placeenv`` works with FastAPI & co. unimportable, and ``import
  placeenv.serve`` then says which extra to install.
"""

from __future__ import annotations

import configparser
import email.parser
import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import placeenv.sim

ROOT = Path(__file__).resolve().parents[2]

# What must never be packaged, and what the wheel holds.
GENERIC = {"service", "models", "tests", "benchmarks", "loadtest"}
TOP_LEVEL = {"placeenv", "pytest_placeenv"}
# The service stack (top-level module names). httpx is not here: paddle itself imports it.
SERVICE_MODULES = ("fastapi", "uvicorn", "starlette", "pydantic", "pydantic_core", "pydantic_settings",
                   "prometheus_client")


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child process, without this session's PYTEST_* settings (a child pytest
    must load its plugins as a plain run would: PYTEST_DISABLE_PLUGIN_AUTOLOAD, PYTEST_PLUGINS, ...)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


# --------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the working tree (setuptools copies a stale ``build/lib``
    into the wheel, so the repository's own ``build/`` must not take part)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache",
        ".hypothesis", ".ruff_cache", ".mypy_cache", "results",
    ))
    out = tmp / "dist"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
               "-q", "-w", str(out), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, env=_clean_env(), timeout=300)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    (built,) = out.glob("placeenv-*.whl")
    return built


def _dist_info_file(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(f".dist-info/{name}")]
        return archive.read(path).decode()


def test_wheel_has_only_placeenv_and_the_plugin_module_at_top_level(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1, dist_info
    assert top - dist_info == {"placeenv", "pytest_placeenv.py"}  # a package and a module, no .data
    modules = {t.removesuffix(".py") for t in top - dist_info}
    assert modules == TOP_LEVEL
    assert not modules & GENERIC
    # the service moved inside the package, with its package data
    for needed in ("placeenv/serve/__init__.py", "placeenv/serve/__main__.py", "placeenv/serve/http/app.py",
                   "placeenv/serve/process/cli.py", "placeenv/serve/engine/engine.py", "placeenv/serve/protocol/gateway.py",
                   "placeenv/serve/models/repository.py", "placeenv/serve/models/bundled/digits/config.yaml",
                   "placeenv/serve/models/bundled/digits/1/model.py",
                   "placeenv/serve/models/bundled/digits/1/model.json",
                   "placeenv/serve/models/bundled/digits/1/model.pdiparams",
                   "placeenv/sim/sim_device.cc", "placeenv/testing.py"):
        assert needed in names, needed
    assert not any("__pycache__" in name for name in names)


def test_wheel_metadata_library_requires_paddle_and_numpy_only(wheel):
    metadata = email.parser.Parser().parsestr(_dist_info_file(wheel, "METADATA"))
    assert metadata["Name"] == "placeenv"
    requirements = [Requirement(line) for line in metadata.get_all("Requires-Dist")]

    def needed_with(extra: str) -> dict[str, Requirement]:
        return {canonicalize_name(r.name): r for r in requirements
                if r.marker is None or r.marker.evaluate({"extra": extra})}

    unconditional = needed_with("")
    assert set(unconditional) == {"paddlepaddle", "numpy"}
    assert set(metadata.get_all("Provides-Extra")) >= {"service", "dev"}

    service = {name: r for name, r in needed_with("service").items() if name not in unconditional}
    assert {"fastapi", "uvicorn", "pydantic", "pydantic-settings", "prometheus-client"} <= set(service)
    assert "standard" in service["uvicorn"].extras
    # dev = the service extra + tools (the tests need the service)
    dev = [r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": "dev"})
           and not r.marker.evaluate({"extra": ""})]
    assert any(canonicalize_name(r.name) == "placeenv" and r.extras == {"service"} for r in dev)
    assert {"pytest", "packaging"} <= {canonicalize_name(r.name) for r in dev}


def test_wheel_entry_points_plugin_module_and_console_script(wheel):
    entry_points = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    entry_points.optionxform = str  # names are case-sensitive
    entry_points.read_string(_dist_info_file(wheel, "entry_points.txt"))
    assert dict(entry_points["pytest11"]) == {"placeenv": "pytest_placeenv"}
    assert entry_points["console_scripts"]["placeenv-serve"] == "placeenv.serve.process.cli:main"


# --------------------------------------------------------------------------- the pytest plugin


def _python(code: str, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, away from the repository (what is imported is what is installed)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, env=_clean_env(), cwd=cwd, timeout=timeout)


def test_plugin_module_imports_neither_placeenv_nor_paddle(tmp_path):
    result = _python("""
        import sys
        import pytest_placeenv
        assert callable(pytest_placeenv.sim_run)
        print(sorted({"placeenv", "paddle"} & {m.partition(".")[0] for m in sys.modules}))
    """, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


def test_testing_helpers_are_not_a_plugin_and_import_neither_pytest_nor_paddle(tmp_path):
    result = _python("""
        import sys
        import placeenv.testing
        assert callable(placeenv.testing.run_with_sim) and callable(placeenv.testing.count_wrong_places)
        assert not hasattr(placeenv.testing, "sim_run")
        print(sorted({"pytest", "_pytest", "paddle"} & {m.partition(".")[0] for m in sys.modules}))
    """, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


# A project that never asks for placeenv: each test holds one stock-Paddle property.
STOCK_TESTS = '''
import sys
import threading

import paddle


def test_placeenv_is_not_imported():
    assert "placeenv" not in sys.modules


def test_paddle_has_no_placeenv_aliases():
    assert not hasattr(paddle, "PlaceEnv")
    assert not hasattr(paddle.device, "PlaceEnv")


def test_a_child_threads_set_device_moves_the_main_thread():
    # Stock Paddle has one current device per process (Paddle #77927).
    paddle.set_device("sim:0")
    child = threading.Thread(target=paddle.set_device, args=("sim:1",))
    child.start()
    child.join()
    assert paddle.get_device() == "sim:1"
    place = paddle.ones([1]).place
    assert place.is_custom_place() and place.custom_device_id() == 1
'''

# Runs after STOCK_TESTS (files in name order): the fixture imports placeenv when used.
PLUGIN_TEST = '''
def test_sim_run_comes_from_the_installed_plugin(request, sim_run):
    plugin = request.config.pluginmanager.get_plugin("placeenv")  # the pytest11 entry point's name
    assert plugin is not None and plugin.__name__ == "pytest_placeenv"
    result = sim_run("print('fresh interpreter')", prepare=False)
    assert result.stdout.strip() == "fresh interpreter"
'''

STOCK_NAMES = ("test_placeenv_is_not_imported", "test_paddle_has_no_placeenv_aliases",
               "test_a_child_threads_set_device_moves_the_main_thread")
PLUGIN_NAME = "test_sim_run_comes_from_the_installed_plugin"


def _run_project(project: Path, conftest: str | None) -> dict[str, str]:
    """``python -m pytest`` in ``project``; {test name: passed | failed | error | skipped}."""
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")  # its own rootdir, no inherited configuration
    (project / "test_a_stock.py").write_text(STOCK_TESTS)
    (project / "test_b_plugin.py").write_text(PLUGIN_TEST)
    if conftest is not None:
        (project / "conftest.py").write_text(conftest)
    report = project.parent / f"{project.name}.xml"
    env = _clean_env(**placeenv.sim.environment(2))  # sim devices by environment only: no placeenv import
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={report}"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )
    assert report.is_file(), f"pytest wrote no report ({result.returncode}):\n{result.stdout[-4000:]}"
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
    outcomes["_output"] = result.stdout[-6000:] + result.stderr[-3000:]
    return outcomes


def test_pytest_plugin_leaves_paddle_stock(tmp_path):
    outcomes = _run_project(tmp_path / "project", conftest=None)
    output = outcomes.pop("_output")
    assert outcomes == {name: "passed" for name in (*STOCK_NAMES, PLUGIN_NAME)}, output


def test_negative_control_the_same_project_importing_placeenv_fails(tmp_path):
    """The checks above see patched Paddle: each stock property fails once conftest imports placeenv."""
    outcomes = _run_project(tmp_path / "project", conftest="import placeenv\n")
    output = outcomes.pop("_output")
    assert outcomes == {**{name: "failed" for name in STOCK_NAMES}, PLUGIN_NAME: "passed"}, output


# --------------------------------------------------------------------------- no service stack


BLOCKED_LIBRARY_USE = '''
    import importlib.abc
    import sys

    BLOCKED = set(sys.argv[1].split(","))

    class NotInstalled(importlib.abc.MetaPathFinder):
        """The service stack, as if its distributions were not installed."""

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    assert not BLOCKED & {m.partition(".")[0] for m in sys.modules}, "already imported at start-up"
    sys.meta_path.insert(0, NotInstalled())
    try:
        import fastapi  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("the blocker does not work")

    import placeenv.sim
    placeenv.sim.prepare(2)
    import paddle
    import placeenv
    from placeenv import PlaceEnv, device_name

    paddle.set_device("sim:0")
    with PlaceEnv("sim:1"):
        inside = paddle.ones([2])
    after = paddle.ones([2])
    assert device_name(inside.place) == "sim:1", inside.place
    assert device_name(after.place) == "sim:0", after.place
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    assert not loaded, loaded

    for module in ("placeenv.serve", "placeenv.serve.__main__"):
        try:
            __import__(module)
        except ImportError as exc:
            assert type(exc) is ImportError, f"{module}: {type(exc).__name__}: {exc}"
            assert "placeenv[service]" in str(exc), f"{module}: {exc}"
            message = str(exc)
        else:
            raise AssertionError(f"import {module} worked without the service stack")
    print(message)
'''


def test_library_works_without_the_service_stack_and_serve_names_the_extra(tmp_path):
    result = _python(BLOCKED_LIBRARY_USE, ",".join(SERVICE_MODULES), cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "pip install 'placeenv[service]'" in result.stdout
