"""A read-only install serves the bundled models: start-up builds mobilenet's program into the
per-user cache (``$XDG_CACHE_HOME/placeenv/examples``), never into the installed package.

The package is installed from a wheel built from this checkout into a directory of its own,
made read-only, and served from there with a fresh ``XDG_CACHE_HOME``. The tests run as root
here, where ``chmod a-w`` stops nothing, so the check is that no file appears in the package;
the control shows that check catching what start-up used to do (build into the package).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.servers import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PLACEENV_"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def _files(root: Path) -> set[Path]:
    return {path.relative_to(root) for path in root.rglob("*")}


def _set_writable(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """``site``: the wheel of this checkout installed with ``pip --target``, every file read-only."""
    tmp = tmp_path_factory.mktemp("readonly")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "pytest_placeenv.py"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "placeenv", source / "placeenv",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for command in (
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp / "dist"), str(source)],
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(tmp / "site"),
         "--find-links", str(tmp / "dist"), "placeenv"],
    ):
        result = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)
        assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    site = tmp / "site"
    _set_writable(site, False)
    yield site
    _set_writable(site, True)  # so pytest can remove it


def _run_from(site: Path, cwd: Path, cache: Path) -> dict[str, str]:
    """The environment that imports placeenv from ``site`` (cwd must be outside this checkout)."""
    env = _env(PYTHONPATH=str(site), XDG_CACHE_HOME=str(cache))
    found = subprocess.run([sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec("
                            "'placeenv').origin)"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == str(site / "placeenv" / "__init__.py"), found
    return env


def test_a_read_only_install_serves_mobilenet_built_into_the_user_cache(installed, tmp_path):
    cache = tmp_path / "cache"
    before = _files(installed)
    env = _run_from(installed, tmp_path, cache)
    with ServiceProcess(wrap=["env", "-C", str(tmp_path)], extra_env=env, devices="cpu", workers_per_device=1,
                        models="mobilenet", model_repository="") as service:
        body = {"inputs": [{"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.5] * 3072}]}
        answer = httpx.post(service.url + "/v2/models/mobilenet/infer", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["shape"] == [1, 10]
    assert _files(installed) == before  # nothing written into the package
    built = sorted(cache.glob("placeenv/examples/mobilenet-*/1/model.*"))
    assert [p.name for p in built] == ["model.json", "model.pdiparams"], built


def test_control_building_into_the_package_as_start_up_did_is_caught(installed, tmp_path):
    """What start-up did before (``ensure_mobilenet(BUNDLED)``): refused by a read-only directory for
    a user, and for root (who may write anyway) seen by the check above as new files in the package."""
    before = _files(installed)
    bundled = installed / "placeenv" / "serve" / "models" / "bundled"
    env = _run_from(installed, tmp_path, tmp_path / "cache")
    result = subprocess.run([sys.executable, "-m", "placeenv.serve.models.examples", str(bundled)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    try:
        if os.geteuid() == 0:
            assert result.returncode == 0, result.stderr[-3000:]
            assert _files(installed) != before
        else:
            assert result.returncode != 0 and "Permission denied" in result.stderr, result.stderr[-3000:]
    finally:
        _set_writable(installed, True)
        shutil.rmtree(bundled / "mobilenet" / "1", ignore_errors=True)
        _set_writable(installed, False)
