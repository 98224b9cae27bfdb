"""The README's promises about the repository itself."""

from __future__ import annotations

import re
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
