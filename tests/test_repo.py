"""The README's promises about the repository itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set-up: the two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    assert len(commands) == 2
    run_service, run_tests = commands
    assert run_service.endswith("python -m placeenv.serve")
    assert "'.[service]'" in run_service or "'.[dev]'" in run_service  # the service needs its extra
    assert run_tests.endswith("python -m pytest")
    ci = (ROOT / ".ci/run").read_text().splitlines()
    assert run_tests in ci  # verbatim, not a paraphrase


def test_an_exception_in_a_worker_thread_fails_its_test(tmp_path):
    """The project's pytest configuration turns pytest's unhandled-thread-exception warning into a failure."""
    (tmp_path / "test_thread.py").write_text(
        "import threading\n\n"
        "def test_worker_raises():\n"
        "    t = threading.Thread(target=lambda: 1 / 0)\n"
        "    t.start()\n"
        "    t.join()\n"
    )
    empty = tmp_path / "empty.ini"
    empty.write_text("[pytest]\n")

    def run(config):
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(config),
             "--rootdir", str(tmp_path), str(tmp_path / "test_thread.py")],
            capture_output=True, text=True, timeout=120,
        )

    ours, default = run(ROOT / "pyproject.toml"), run(empty)
    assert ours.returncode == 1 and "PytestUnhandledThreadExceptionWarning" in ours.stdout
    assert default.returncode == 0  # the control: pytest's default only warns


def test_readme_library_example_runs_as_written():
    """The README's library example, in a fresh interpreter that has no sim devices until it asks."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## The library\n", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.+?)\n```", section, re.S)[0]
    env = {k: v for k, v in os.environ.items() if k not in ("CUSTOM_DEVICE_ROOT", "PLACEENV_SIM_DEVICES")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["Place(sim:0) Place(sim:1)", "Place(cpu) Place(sim:1) sim:0"]


def test_docs_link_nothing_outside_the_repository():
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)]+)\)", path.read_text()):
            if not target.startswith(("http://", "https://", "#")):
                assert (path.parent / target.split("#")[0]).resolve().is_relative_to(ROOT), (path, target)
                assert (path.parent / target.split("#")[0]).exists(), (path, target)
        assert "../shared" not in path.read_text(), path


def test_readme_serve_your_own_model_runs_as_written(tmp_path):
    """The README's "Serve your own model": save with jit.save, serve that directory, call it with
    tritonclient and with curl, each block as written (only the port differs)."""
    from servers import ServiceProcess

    text = (ROOT / "README.md").read_text()
    section = text.split("### Serve your own model\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```(python|bash)\n(.+?)\n```", section, re.S)
    assert [kind for kind, _ in blocks] == ["python", "bash", "python", "bash"]
    (_, save), (_, serve), (_, call), (_, curls) = blocks
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}
    saved = subprocess.run([sys.executable, "-c", save], cwd=tmp_path, capture_output=True, text=True, env=env,
                           timeout=180)
    assert saved.returncode == 0, saved.stderr[-3000:]
    repository = re.fullmatch(r"\.venv/bin/python -m placeenv\.serve --model-repository (\S+)\s+#.*", serve)
    assert repository, serve
    with ServiceProcess(model_repository=tmp_path / repository[1], models="", devices="sim:0,sim:1") as service:
        port = str(service.port)
        called = subprocess.run([sys.executable, "-c", call.replace("127.0.0.1:8000", f"127.0.0.1:{port}")],
                                capture_output=True, text=True, timeout=120)
        assert called.returncode == 0, called.stderr[-3000:]
        rows = re.findall(r"\[([^\[\]]+)\]", called.stdout)  # numpy's print of a 2x3 array
        assert len(rows) == 2 and all(len(row.split()) == 3 for row in rows), called.stdout
        commands = [c for c in curls.replace("\\\n", " ").splitlines() if c.strip()]
        metadata = subprocess.run(commands[0].split("#")[0].replace("8000", port), shell=True,
                                  capture_output=True, text=True, timeout=60)
        assert '"inputs":[{"name":"features","datatype":"FP32","shape":[-1,4]}]' in metadata.stdout
        answer = subprocess.run(commands[1].replace("8000", port), shell=True, capture_output=True, text=True,
                                timeout=60)
        assert '"model_name":"iris"' in answer.stdout and '"shape":[1,3]' in answer.stdout, answer.stdout
