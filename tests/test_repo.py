"""The README's promises about the repository itself."""

from __future__ import annotations

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
