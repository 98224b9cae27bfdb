"""The README's promises about the repository itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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

    def run(config):  # (-n 0: one process, not the suite's xdist workers, which the file's addopts start)
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(config),
             "--rootdir", str(tmp_path), "-n", "0", str(tmp_path / "test_thread.py")],
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


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md",
        ROOT / "deploy" / "k8s" / "README.md"]


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
            for title in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_every_relative_link_in_readme_and_docs_resolves():
    """Each relative link names a file in the repository, and each #anchor a heading of its target."""
    checked = 0
    for path in DOCS:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            assert resolved.is_relative_to(ROOT), (path, target)
            assert resolved.exists(), f"{path.relative_to(ROOT)}: {target} does not exist"
            if anchor:
                assert anchor in _anchors(resolved), f"{path.relative_to(ROOT)}: no heading for #{anchor} in {file}"
            checked += 1
        assert "../shared" not in path.read_text(), path
    assert checked > 20  # the check sees the links (a broken regex would pass vacuously)


def test_heading_anchors_are_githubs(tmp_path):
    """The anchors the link check compares with: GitHub's, and never from a code block."""
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n\n## The `/predict` API (v2)\n\n```\n# not a heading\n```\n")
    assert _anchors(doc) == {"title", "the-predict-api-v2"}


def test_readme_is_short_and_every_doc_says_who_it_is_for():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 190
    for path in sorted((ROOT / "docs").glob("*.md")):
        paragraphs = path.read_text().split("\n\n")
        assert paragraphs[1].startswith("For "), f"{path.name} starts without saying who it is for"


def _activated_env(tmp_path: Path) -> dict:
    """What `. .venv/bin/activate` gives a shell: the venv's bin first on PATH; no sim or service settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PLACEENV_") and k not in ("CUSTOM_DEVICE_ROOT", "FLAGS_use_stride_kernel")}
    bin_dir = Path(sys.executable).parent
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(bin_dir.parent))
    return env


def test_readme_service_example_runs_as_written(tmp_path):
    """The README's service example: the bash block as written (only the port differs), in an
    activated virtualenv: curl and tritonclient against the served model, then `kill %1` last."""
    from support.servers import free_port

    text = (ROOT / "README.md").read_text()
    section = text.split("## The service\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.+?)\n```", section, re.S)
    assert [kind for kind, _ in blocks] == ["bash"]
    script = blocks[0][1]
    assert script.splitlines()[-1].startswith("kill %1 "), "the server is stopped after everything that calls it"
    port = str(free_port())
    script = script.replace("localhost:8000", f"localhost:{port}").replace(
        "127.0.0.1:8000", f"127.0.0.1:{port}").replace(
        "placeenv-serve --model-repository my-models", f"placeenv-serve --port {port} --model-repository my-models")
    # The block's `pip install` finds tritonclient installed (the dev extra): no index, no network.
    env = {**_activated_env(tmp_path), "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    ran = subprocess.run(["bash", "-c", script + "\nwait"], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=300)
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-3000:])
    lines = ran.stdout.splitlines()
    # Each curl answer is a line of its own (`; echo`): not run together with what follows.
    metadata = [line for line in lines if line.startswith('{"name":"iris"')]
    assert len(metadata) == 1 and metadata[0].endswith("}"), ran.stdout
    assert '"inputs":[{"name":"features","datatype":"FP32","shape":[-1,4]}]' in metadata[0], ran.stdout
    answers = [line for line in lines if line.startswith('{"model_name":"iris"')]
    assert len(answers) == 1 and answers[0].endswith("}") and '"shape":[1,3]' in answers[0], ran.stdout
    rows = re.findall(r"\[([^\[\]{}\"]+)\]", "\n".join(lines[lines.index(answers[0]) + 1:]))  # numpy's 2x3 print
    assert len(rows) == 2 and all(len(row.split()) == 3 for row in rows), ran.stdout
    assert "stopped:" in ran.stderr, ran.stderr[-2000:]  # `kill %1` drained it and it said so


def test_readme_paddlex_example_runs_as_written(tmp_path):
    """The README's PaddleX example: the bash block as written (only the port differs) from a checkout's
    root, in an activated virtualenv: the wheel fetched, PaddleX's OCR and PP-StructureV3 files served, then
    curl, PaddleX's client and tritonclient read the page's text, curl and PaddleX's client a PDF's Markdown,
    and `kill %1` last."""
    from support.servers import free_port

    text = (ROOT / "README.md").read_text()
    section = text.split("## Real models: PaddleX's pipeline files\n", 1)[1].split("\n## ", 1)[0]
    (script,) = re.findall(r"```bash\n(.+?)\n```", section, re.S)
    assert script.splitlines()[-1] == "kill %1"
    port = str(free_port())
    script = script.replace("localhost:8000", f"localhost:{port}").replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    script = script.replace("placeenv-serve --model-repository", f"placeenv-serve --port {port} --model-repository")
    (tmp_path / "tests").symlink_to(ROOT / "tests")  # what the block copies and runs from the checkout
    (tmp_path / "loadtest").symlink_to(ROOT / "loadtest")
    ran = subprocess.run(["bash", "-c", script + "\nwait"], cwd=tmp_path, capture_output=True, text=True,
                         env=_activated_env(tmp_path), timeout=600)
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-3000:])
    lines = ran.stdout.splitlines()
    answer = next(line for line in lines if line.startswith('{"logId"'))
    assert '"rec_texts":["Hello PaddleOCR 2026"]' in answer and answer.endswith('"errorCode":0,"errorMsg":"Success"}')
    assert "['Hello PaddleOCR 2026']" in lines and "[b'Hello PaddleOCR 2026']" in lines, ran.stdout
    # PP-StructureV3 on a PDF: curl's answer (its first bytes), and the page's title in PaddleX's client's Markdown.
    assert any(line.startswith('{"logId"') and '"layoutParsingResults"' in line for line in lines), ran.stdout
    assert "# Summary Office Amount" in lines, ran.stdout
    assert "stopped:" in ran.stderr, ran.stderr[-2000:]


def test_files_named_in_the_container_files_comments_exist():
    """The comments of the Dockerfile and the compose files point at real files (the Dockerfile
    once named a deploy/ci-compose.sh that never existed)."""
    named = set()
    for name in ("Dockerfile", "docker-compose.yml", "docker-compose.gpu.yml", "deploy/compose.ci.yml", ".ci/run"):
        comments = [line.split("#", 1)[1] for line in (ROOT / name).read_text().splitlines() if "#" in line]
        named |= set(re.findall(r"(?<![\w/.-])((?:\.ci|benchmarks|deploy|docs|placeenv|tests)/[\w./-]*\w)",
                                "\n".join(comments)))
    assert {"tests/e2e/test_compose_engine.py", "deploy/compose.ci.yml"} <= named  # the check sees them
    assert not [path for path in named if not (ROOT / path).exists()]
