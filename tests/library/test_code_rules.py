"""Rules of the codebase that a reviewer would otherwise check by hand.

* One contract with Paddle: outside ``placeenv/_internals.py`` no code names a
  Paddle private, and nothing outside the library's own modules imports the
  contract, so a Paddle upgrade is reviewed in one file.
* Comments and docstrings in ``placeenv/`` say why, never a measured figure:
  figures live in docs/benchmarks.md.
* Tests wait for conditions, never a fixed time: no ``time.sleep`` outside the poll helpers, no
  ``join(1.0)`` whose end goes unchecked, no ``asyncio.sleep(0.01)`` as a pace.
* A test skips for a missing program only through ``support.tools.need_tool``, which fails under
  ``CI=true``, and ``.ci/run`` installs every program it knows.
* The service's rooms import only the rooms below them, and ``placeenv/`` has no import circle.

Each rule is a scanner run over the tree, plus a negative control showing the
scanner catches what it forbids. The contract is read as text (ast), not
imported: importing it is what the second rule forbids.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
while not (ROOT / "pyproject.toml").exists():
    ROOT = ROOT.parent
CONTRACT = ROOT / "placeenv" / "_internals.py"

#: Files outside placeenv/ that name a Paddle private on purpose: each exercises
#: that very internal against stock Paddle (the contract's own tests, negative
#: controls of the guards and Tracers placeenv replaces, the micro-benchmark of
#: the patched function). Anything else naming one fails.
PRIVATE_NAMES_ALLOWED = {
    "benchmarks/bench_placeenv.py",
    "tests/library/test_install.py",
    "tests/library/test_apis.py",
    "tests/library/test_placeenv.py",
    "tests/library/test_seeds.py",
}
#: The contract's own test: it checks the version guard and what the patch swaps; and the count of a request's
#: copies, which wraps the contract's copies (every tensor the request path makes or moves goes through them).
CONTRACT_IMPORT_ALLOWED = {"tests/library/test_install.py", "tests/service/engine/test_request_copies.py"}
#: This file: its negative controls quote what the rules forbid.
SELF = Path(__file__).resolve()


def _contract_literals() -> list:
    """Every string the contract's module-level constants hold (paths and attribute names)."""
    found = []
    for node in ast.parse(CONTRACT.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.Dict, ast.Tuple)):
            for constant in ast.walk(node.value):
                if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                    found.append(constant.value)
    return found


def private_names() -> set[str]:
    """Paddle's private names placeenv touches: every ``_name`` (not dunder) in the contract's
    paths and attribute lists, plus the modules that hold them."""
    names = {"global_var", "_global_expected_place_", "_dygraph_tracer_", "_expected_place"}
    for literal in _contract_literals():
        for part in literal.split("."):
            if part.startswith("_") and not part.startswith("__") and len(part) > 2:
                names.add(part)
    return names


def find_private_names(text: str, names: set[str]) -> list[str]:
    """The Paddle private names, or ``paddle.base`` paths, that ``text`` mentions as whole names
    (``_pd.current_expected_place`` is placeenv's own function, not Paddle's ``_current_expected_place``)."""
    pattern = re.compile(r"(?<![\w])(?:" + "|".join(map(re.escape, sorted(names))) + r")(?!\w)|\bpaddle\.base\b")
    return [match.group(0) for match in pattern.finditer(text)]


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_contract_names_the_privates_the_rule_looks_for():
    names = private_names()
    assert {"_global_expected_place_", "_dygraph_tracer_", "_expected_place", "global_var",
            "_current_expected_place_", "_switch_tracer", "_train_mode", "_copy_to"} <= names


def test_no_code_outside_the_contract_names_a_paddle_private():
    names = private_names()
    offenders = {}
    for path in python_files("placeenv", "tests", "benchmarks", "loadtest", "deploy"):
        if path in (CONTRACT, SELF) or relative(path) in PRIVATE_NAMES_ALLOWED:
            continue
        hits = find_private_names(path.read_text(), names)
        if hits:
            offenders[relative(path)] = sorted(set(hits))
    assert offenders == {}


@pytest.mark.parametrize("line", [
    "place = _pd.framework._global_expected_place_",  # the old placeenv.state
    "_pd.global_var.__dict__['_dygraph_tracer_'] = tracer",
    "tracer._expected_place = place",
    "from paddle.base import framework",
    "# reads _current_expected_place_ first",
    "x=_global_expected_place_",
    "{'tracer': _dygraph_tracer_}",
    "f(a,_copy_to(t))",
    "_pd._global_expected_place_",
])
def test_the_private_name_scanner_catches_them(line):
    """Negative control: what the old modules wrote is caught."""
    assert find_private_names(line, private_names())


def test_the_private_name_scanner_passes_the_contracts_own_function_names():
    assert find_private_names("_pd.current_expected_place(); _pd.set_expected_place(p)", private_names()) == []


CONTRACT_IMPORT = re.compile(
    r"^\s*(?:from\s+placeenv\s+import\s+[^\n]*\b_internals\b|from\s+placeenv\._internals\s+import|"
    r"import\s+placeenv\._internals\b|from\s+\.+\s+import\s+[^\n]*\b_internals\b|from\s+\.+_internals\s+import)"
    r"|import_module\(\s*[\"']placeenv\._internals[\"']",
    re.MULTILINE,
)


def imports_contract(text: str) -> bool:
    return CONTRACT_IMPORT.search(text) is not None


def test_nothing_outside_the_library_imports_the_contract():
    library = {p for p in (ROOT / "placeenv").glob("*.py")}  # placeenv's own modules, not its subpackages
    offenders = [
        relative(path) for path in python_files("placeenv", "tests", "benchmarks", "loadtest", "deploy")
        if path not in library and path != SELF and relative(path) not in CONTRACT_IMPORT_ALLOWED
        and imports_contract(path.read_text())
    ]
    assert offenders == []


@pytest.mark.parametrize("line", [
    "from placeenv import _internals as _pd",  # the service's models, before
    "import placeenv._internals as internals",
    "from placeenv._internals import resolve",
    "from .. import _internals",
    "x = importlib.import_module('placeenv._internals')",
])
def test_the_import_scanner_catches_them(line):
    assert imports_contract(line)


# -- comments say why; figures live in docs/benchmarks.md --------------------

#: A measured figure: a number with a unit of time, rate, size or share, or a speed-up.
FIGURE = re.compile(
    r"(?<![\w.])~?\d[\d,]*(?:\.\d+)?\s*(?:µs|us|ms|%|req/s|MB|MiB|KB|KiB|GB|GiB|x faster|x slower|×)(?!\w)"
)


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """Every comment and docstring of a module, with its line."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
        # Attribute docstrings (#: lines are comments above) and help texts of settings.
        if isinstance(node, ast.keyword) and node.arg in ("description", "help") \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.append((node.value.lineno, node.value.value))
    return found


def figures_in(source: str) -> list[tuple[int, str]]:
    return [(line, match.group(0)) for line, text in comments_and_docstrings(source)
            for match in FIGURE.finditer(text)]


def test_no_comment_or_docstring_in_the_package_quotes_a_measured_figure():
    offenders = {relative(path): figures_in(path.read_text()) for path in python_files("placeenv")}
    assert {path: hits for path, hits in offenders.items() if hits} == {}


@pytest.mark.parametrize("source", [
    "# costs ~0.4 us a field, more than the switch\nx = 1\n",
    'def f():\n    """Soak p99 64 -> 211 ms in 12 min."""\n',
    "x = Field(description='one process serves 1,838 req/s')\n",
    "# 13% of a small request's time\n",
    "# 7.7x faster on CPU\n",
])
def test_the_figure_scanner_catches_them(source):
    assert figures_in(source)


def test_the_figure_scanner_leaves_code_and_plain_numbers_alone():
    assert figures_in("# up to 32 examples a batch, HTTP 413\ntimeout_ms = 250  # a setting\n") == []


# -- tests wait for conditions, not for time --------------------------------

#: The poll helpers: the only places a test sleeps (between looks at a condition, or a clock's tick).
SLEEPERS = {"tests/support/polling.py", "tests/support/clock.py"}
TIME_SLEEP = re.compile(r"\btime\.sleep\(|^\s*from\s+time\s+import\s+[^\n]*\bsleep\b", re.MULTILINE)


def test_no_test_sleeps_outside_the_poll_helpers():
    offenders = [relative(path) for path in python_files("tests")
                 if relative(path) not in SLEEPERS and path != SELF and TIME_SLEEP.search(path.read_text())]
    assert offenders == []


@pytest.mark.parametrize("source", ["time.sleep(0.2)  # let the worker start\n", "from time import sleep\n"])
def test_the_sleep_scanner_catches_them(source):
    assert TIME_SLEEP.search(source)


def _number(node: ast.AST | None) -> bool:
    """Whether ``node`` is a literal number (``1.0``, ``-1``): a time fixed in the source."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
        and not isinstance(node.value, bool)


def _timeout_arg(call: ast.Call) -> ast.AST | None:
    return call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "timeout"), None)


def _statement_lists(tree: ast.AST):
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                yield statements


def fixed_waits(source: str) -> list[tuple[int, str]]:
    """The fixed waits of ``source`` that are not ``time.sleep``, with their lines:

    * ``t.join(1.0)`` followed by an assertion that is not ``assert not t.is_alive()``: the assertion
      reads a thread that may still run, or (``assert t.is_alive()``) waits the whole second to see
      that something did not happen. A join with a deadline is a wait for the thread's end only
      when the next line checks that it ended.
    * ``assert not event.wait(1.0)``: the same second spent to see that something did not happen.
    * ``await asyncio.sleep(0.01)``: a pace of fixed time; ``asyncio.sleep(0)`` (a yield to the
      loop) and a computed delay (a load's schedule) are not fixed.
    """
    tree = ast.parse(source)
    found = []
    sleeps = {alias.asname or alias.name for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module == "asyncio"
              for alias in node.names if alias.name == "sleep"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (ast.unparse(node.func) == "asyncio.sleep"
                                           or (isinstance(node.func, ast.Name) and node.func.id in sleeps)):
            delay = node.args[0] if node.args else None
            if _number(delay) and ast.literal_eval(delay) != 0:
                found.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.UnaryOp) \
                and isinstance(node.test.op, ast.Not) and isinstance(node.test.operand, ast.Call):
            call = node.test.operand
            if isinstance(call.func, ast.Attribute) and call.func.attr == "wait" \
                    and _number(_timeout_arg(call)):
                found.append((node.lineno, ast.unparse(node.test)))
    for statements in _statement_lists(tree):
        for statement, following in zip(statements, statements[1:]):
            call = statement.value if isinstance(statement, ast.Expr) else None
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "join" and _number(_timeout_arg(call))):
                continue
            ended = f"not {ast.unparse(call.func.value)}.is_alive()"
            if isinstance(following, ast.Assert) and not ast.unparse(following.test).startswith(ended):
                found.append((statement.lineno, ast.unparse(call)))
    return sorted(found)


def test_no_test_waits_a_fixed_time_another_way():
    offenders = {relative(path): hits for path in python_files("tests")
                 if relative(path) not in SLEEPERS and path != SELF
                 for hits in [fixed_waits(path.read_text())] if hits}
    assert offenders == {}


@pytest.mark.parametrize("source", [
    "same.join(1.0)\nassert same.is_alive(), 'two kernels ran at once'\n",
    "thread.join(30)\nassert not errors\n",
    "worker.join(timeout=0.5)\nassert seen == ['a']\n",
    "def f():\n    if x:\n        t.join(2)\n        assert done\n",
    "async def pace():\n    await asyncio.sleep(0.01)\n",
    "from asyncio import sleep\n\nasync def f():\n    await sleep(1)\n",
    "assert not stopped.wait(0.5), 'stopped too early'\n",
])
def test_the_fixed_wait_scanner_catches_them(source):
    assert fixed_waits(source)


@pytest.mark.parametrize("source", [
    "thread.join(30)\nassert not thread.is_alive(), 'did not finish'\n",
    "t.join(120)\nassert not t.is_alive() and not errors\n",
    "thread.join()\nassert not errors\n",  # no timeout: it ends when the thread does
    "self._thread.join(10)\n",  # a clean-up, read by nothing
    "async def f():\n    await asyncio.sleep(0)\n    await asyncio.sleep(delay)\n",
    "assert ready.wait(30), 'never ready'\n",  # a deadline: it returns when the event is set
])
def test_the_fixed_wait_scanner_passes_deadlines(source):
    assert fixed_waits(source) == []


# -- the service's rooms: each imports only the rooms below it (docs/architecture.md) -------------

SERVE = ROOT / "placeenv" / "serve"
#: The modules every room may import, which import no room themselves.
BASE = {"config", "metrics"}
#: Each room, and the rooms it may import besides itself and ``BASE``.
ROOMS = {
    "protocol": set(),
    "models": {"protocol"},
    "engine": {"protocol", "models"},
    "http": {"protocol"},
    "grpc": {"protocol"},
    "process": {"protocol", "models", "engine", "http", "grpc"},
    "__main__": {"process"},
    "__init__": set(),
}
#: The adapters: each protocol's reading of a request. They hand it to ``Gateway.infer`` and count nothing.
ADAPTERS = ("placeenv/serve/http/predict.py", "placeenv/serve/http/v2.py", "placeenv/serve/grpc.py")


def room(module: str) -> str:
    """The room of a module of placeenv.serve: ``placeenv.serve.http.app`` is in "http"."""
    parts = module.split(".")[2:]
    return parts[0] if parts else "__init__"


def serve_module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> list[str]:
    """Every placeenv.serve module ``source`` imports (function bodies included), relative imports
    resolved against ``module``; ``from X import y`` counts X.y when y is a module of the tree."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names = [origin]
            for alias in node.names:
                candidate = f"{origin}.{alias.name}"
                path = ROOT.joinpath(*candidate.split("."))
                if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
                    names.append(candidate)
        else:
            continue
        found += [name for name in names if name == "placeenv.serve" or name.startswith("placeenv.serve.")]
    return found


def layering_violations(module: str, imports: list[str]) -> list[str]:
    """The imports of ``module`` that break the rule."""
    own = room(module)
    bad = []
    for imported in imports:
        if imported.endswith(".__main__") or imported == "placeenv.serve.__main__":
            if module != "placeenv.serve.__main__":
                bad.append(imported)
            continue
        target = room(imported)
        if imported == "placeenv.serve" or target == own:
            continue
        if own in BASE or (target not in BASE and target not in ROOMS[own]):
            bad.append(imported)
    return bad


def test_every_module_of_the_service_is_in_a_room():
    rooms = {room(serve_module(path)) for path in SERVE.rglob("*.py")}
    assert rooms <= set(ROOMS) | BASE, rooms - set(ROOMS) - BASE


def test_each_room_of_the_service_imports_only_the_rooms_below_it():
    offenders = {}
    for path in sorted(SERVE.rglob("*.py")):
        module = serve_module(path)
        bad = layering_violations(module, imported_modules(path.read_text(), module, path.name == "__init__.py"))
        if bad:
            offenders[relative(path)] = bad
    assert offenders == {}


@pytest.mark.parametrize("module, line", [
    ("placeenv.serve.http.app", "from ..engine.engine import Engine"),  # an adapter reaching the engine
    ("placeenv.serve.http.app", "    from ..process.server import serve\n"),  # inside a function too
    ("placeenv.serve.process.frontend_main", "from ..__main__ import main"),  # the old DrainingServer import
    ("placeenv.serve.grpc", "from .http import v2"),  # one protocol importing another
    ("placeenv.serve.protocol.gateway", "from ..engine import local"),
    ("placeenv.serve.engine.workers", "from placeenv.serve.http.responses import JSON"),
    ("placeenv.serve.metrics", "from .protocol.errors import ServiceError"),  # a base module importing a room
    ("placeenv.serve.process.supervisor", "from .. import __main__"),
])
def test_the_layering_scanner_catches_them(module, line):
    assert layering_violations(module, imported_modules(line.strip(), module))


def test_the_layering_scanner_passes_what_the_rule_allows():
    allowed = [("placeenv.serve.process.server", "from ..http.app import create_app"),
               ("placeenv.serve.engine.engine", "from ..protocol.errors import ServiceError"),
               ("placeenv.serve.http.v2", "from .. import metrics"),
               ("placeenv.serve.grpc", "from .protocol import wire")]
    for module, line in allowed:
        assert layering_violations(module, imported_modules(line, module)) == [], line


def calls(source: str, name: str) -> list[str]:
    """The receivers of every call of method ``name`` in ``source``: ``self.engine.submit(...)`` gives "self.engine"."""
    return [ast.unparse(node.func.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name]


def test_every_request_enters_the_engine_one_way_and_is_counted_in_one_place():
    """The single process (engine/local.py) and the engine process (process/link_server.py) call the same
    ``Engine.submit``; every adapter hands its request to ``Gateway.infer`` and counts nothing; only
    the gateway counts answers, and only the dispatcher refuses for overload or stopping."""
    sources = {relative(path): path.read_text() for path in SERVE.rglob("*.py")}
    submitters = {path for path, source in sources.items() if "self.engine" in calls(source, "submit")}
    assert submitters == {"placeenv/serve/engine/local.py", "placeenv/serve/process/link_server.py"}
    engine = next(node for node in ast.walk(ast.parse(sources["placeenv/serve/engine/engine.py"]))
                  if isinstance(node, ast.ClassDef) and node.name == "Engine")
    public = {f.name for f in engine.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              and not f.name.startswith("_")}
    assert public == {"submit", "start", "stop", "begin_stopping", "ready", "catalog", "status", "statistics",
                      "load", "unload"}
    for adapter in ADAPTERS:
        assert calls(sources[adapter], "infer") == ["self.gateway" if adapter.endswith("grpc.py") else "gateway"]
        imports = imported_modules(sources[adapter], serve_module(ROOT / adapter))
        assert not calls(sources[adapter], "refuse") and "placeenv.serve.metrics" not in imports, adapter
    counters = {path for path, source in sources.items() if "metrics.ON_LOOP" in calls(source, "count")}
    assert counters == {"placeenv/serve/protocol/gateway.py"}
    # The link refuses past the engine's capacity (its catalog's, the dispatcher's figure) only while
    # the engine answers nothing: a stalled engine cannot grow a front end.
    for error, where in (("Overloaded", {"placeenv/serve/process/link.py"}), ("Draining", set())):
        raisers = {path for path, source in sources.items() if re.search(rf"\b{error}\(", source)
                   and path != "placeenv/serve/protocol/errors.py"}
        assert raisers == {"placeenv/serve/engine/dispatch.py", *where}, error
    readers = {path for path, source in sources.items() if "request_timeout_s" in source}
    assert readers == {"placeenv/serve/config.py", "placeenv/serve/protocol/gateway.py"}


def test_the_one_entry_rule_sees_a_second_way_in():
    """Negative control: a second engine entry, or an adapter counting a refusal, is seen."""
    assert calls("async def run(self, work):\n    return await self.engine.submit(work)\n", "submit") == \
        ["self.engine"]
    assert calls("gateway.refuse(error, name)\n", "refuse") == ["gateway"]
    assert calls("metrics.ON_LOOP.count(label, 'none', 'invalid')\n", "count") == ["metrics.ON_LOOP"]


# -- the service's tests mirror its rooms: the tests of placeenv/serve/<room>/ are in tests/service/<room>/ --

SERVICE_TESTS = ROOT / "tests" / "service"
#: What stays at tests/service/'s top level: the conftest every room's tests share, the tests of the
#: base module metrics.py, and of the benchmarks' reference apps beside the service (docs/testing.md).
SERVICE_TESTS_TOP = {"conftest.py", "test_metrics.py", "test_benchmark_apps.py"}


def service_rooms() -> set[str]:
    """The rooms of ``ROOMS`` that exist in placeenv/serve, as a folder or a module."""
    return {name for name in ROOMS if not name.startswith("__")
            and ((SERVE / name).is_dir() or (SERVE / f"{name}.py").is_file())}


def off_the_rooms(tests: Path, rooms: set[str], top: set[str]) -> list[str]:
    """What breaks the mirror in ``tests``: a folder that is no room (``name/``), a room with no folder
    (``name/ missing``), a Python file at the top level that is not in ``top``."""
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    loose = {p.name for p in tests.glob("*.py")} - top
    return sorted([f"{name}/" for name in folders - rooms] + [f"{name}/ missing" for name in rooms - folders]
                  + list(loose))


def test_the_service_tests_mirror_the_rooms():
    rooms = service_rooms()
    assert rooms == {"protocol", "http", "grpc", "engine", "models", "process"}
    assert off_the_rooms(SERVICE_TESTS, rooms, SERVICE_TESTS_TOP) == []
    assert all(path.relative_to(SERVICE_TESTS).parts[0] in rooms | SERVICE_TESTS_TOP
               for path in SERVICE_TESTS.rglob("test_*.py"))


def test_the_mirror_rule_sees_a_stray_folder_a_missing_room_and_a_loose_file(tmp_path):
    """Negative control: a fake tests/service with a folder that is no room, a room without a folder,
    and a test file at the top level that is not allowed there."""
    for folder in ("http", "engine", "stray", "__pycache__"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"test_{folder.strip('_')}.py").write_text("")
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "test_loose.py").write_text("")
    assert off_the_rooms(tmp_path, {"http", "engine", "grpc"}, {"conftest.py"}) == \
        ["grpc/ missing", "stray/", "test_loose.py"]
    (tmp_path / "stray" / "test_stray.py").unlink()
    (tmp_path / "stray").rmdir()
    (tmp_path / "test_loose.py").unlink()
    (tmp_path / "grpc").mkdir()
    assert off_the_rooms(tmp_path, {"http", "engine", "grpc"}, {"conftest.py"}) == []


# -- a test skips for a missing program only through support.tools, which fails under CI --------------

#: The helper: the one place that looks a program up and skips (or, under CI, fails) without it.
TOOL_HELPER = "tests/support/tools.py"
#: The skips that are not for a missing program, by file: how many, and why each may skip in CI too.
#: A new skip in one of these files raises its count and fails the rule until it is reviewed here.
SKIPS_NOT_FOR_A_TOOL = {
    # A Paddle build's features: pinned memory and the CUDA/XPU builds, and dtypes Paddle cannot cast to.
    "tests/library/test_seeds.py": 3,
    # Paddle warns of a missing ccache only where ccache is missing: a machine with it has nothing to check.
    "tests/service/process/test_startup_messages.py": 1,
    # perf_analyzer is built for Linux x86_64 only: no package brings it elsewhere.
    "tests/e2e/test_perf_analyzer.py": 1,
    # A private read-only mount of / needs root, which CI has; unshare itself comes through the helper.
    "tests/e2e/test_k8s.py": 1,
}
#: Files that look a program up themselves: only to skip where it is present (ccache, above).
WHICH_ALLOWED = {"tests/service/process/test_startup_messages.py"}
SKIP_CALLS = {"skip", "skipif", "importorskip"}
WHICH = re.compile(r"\bshutil\.which\(|^\s*from\s+shutil\s+import\s+[^\n]*\bwhich\b", re.MULTILINE)


def skips(source: str) -> list[int]:
    """The lines of every pytest skip in ``source``: ``pytest.skip(...)``, ``pytest.importorskip(...)``,
    ``pytest.mark.skipif(...)`` and ``@pytest.mark.skip``, and a ``skip``/``skipif`` imported from pytest."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module in ("pytest", "pytest.mark")
                for alias in node.names if alias.name in SKIP_CALLS}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SKIP_CALLS \
                and ast.unparse(node.value) in ("pytest", "pytest.mark", "mark"):
            found.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in imported and isinstance(node.ctx, ast.Load):
            found.append(node.lineno)
    return sorted(found)


def skips_for_a_tool(path: str, source: str) -> list[str]:
    """What breaks the rule in one test file: a program looked up outside the helper, or more skips
    than ``SKIPS_NOT_FOR_A_TOOL`` allows the file."""
    if path == TOOL_HELPER:
        return []
    bad = []
    if path not in WHICH_ALLOWED and WHICH.search(source):
        bad.append("looks a program up: use support.tools.need_tool (or find_tool)")
    found = skips(source)
    if len(found) > SKIPS_NOT_FOR_A_TOOL.get(path, 0):
        bad.append(f"skips at lines {found}: for a program, use support.tools.need_tool")
    return bad


def test_no_test_skips_for_a_missing_program_but_through_the_helper():
    offenders = {}
    for path in python_files("tests"):
        if path != SELF:
            bad = skips_for_a_tool(relative(path), path.read_text())
            if bad:
                offenders[relative(path)] = bad
    assert offenders == {}


def test_each_allowed_skip_is_still_there():
    """The allowance shrinks with its file: a count above what the file has hides a new skip."""
    counts = {path: len(skips((ROOT / path).read_text())) for path in SKIPS_NOT_FOR_A_TOOL}
    assert counts == SKIPS_NOT_FOR_A_TOOL


@pytest.mark.parametrize("source", [
    'KUBECTL = shutil.which("kubectl")\n'
    'needs = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")\n',
    'def test_render():\n    if not os.path.exists("/usr/bin/kubectl"):\n'
    '        pytest.skip("needs kubectl")\n',
    'validate = pytest.importorskip("kubernetes_validate")\n',
    '@pytest.mark.skip(reason="no promtool here")\ndef test_rules():\n    pass\n',
    'from pytest import skip\n\ndef test_x():\n    skip("no nginx")\n',
    'from pytest import mark\n\n@mark.skipif(True, reason="no nginx")\ndef test_x():\n    pass\n',
])
def test_the_tool_skip_scanner_catches_them(source):
    """Negative control: each way a test file could skip, or look a program up, is seen."""
    assert skips_for_a_tool("tests/e2e/test_sample.py", source)


def test_the_tool_skip_scanner_passes_the_helper():
    source = ('from support.tools import need_tool\n\ndef test_render():\n'
              '    kubectl = need_tool("kubectl")\n    assert kubectl\n')
    assert skips_for_a_tool("tests/e2e/test_sample.py", source) == []


def test_ci_installs_every_program_the_helper_knows():
    """.ci/run checks each program of ``support.tools.TOOLS`` and installs its package where it is missing."""
    from support.tools import TOOLS

    assert unchecked_tools((ROOT / ".ci" / "run").read_text(), TOOLS) == []


def unchecked_tools(script: str, tools) -> list[str]:
    """The programs of ``tools`` that ``script`` never looks for with ``command -v``."""
    return [name for name in tools if not re.search(rf"\bcommand -v {re.escape(name)}(?![\w-])", script)]


def test_the_ci_tool_check_sees_a_program_not_installed():
    script = "command -v docker-compose >/dev/null || need+=(docker-compose)\n"
    assert unchecked_tools(script, ["docker-compose", "docker", "kubectl"]) == ["docker", "kubectl"]


# -- no import circle in placeenv/: its modules read bottom-up ----------------------------------------
#
# Every import counts: at module level, inside a function (a lazy import that dodges a circle at run
# time leaves it for the reader), and under ``if TYPE_CHECKING:`` (a module that names another's type
# is read after it). ``from package import name`` is an edge to ``package.name`` where that is a module,
# else to the package.



def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(source: str, module: str, is_package: bool, modules) -> set[str]:
    """The modules of ``modules`` that ``source`` (module ``module``) imports, anywhere in it."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                origin = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                target = f"{origin}.{alias.name}"
                if target in modules:
                    found.add(target)
                elif origin in modules:
                    found.add(origin)
    return found - {module}


def import_graph(root: Path, package: str = "placeenv") -> dict[str, set[str]]:
    paths = {module_name(path, root): path for path in (root / package).rglob("*.py")}
    return {module: module_imports(path.read_text(), module, path.name == "__init__.py", paths)
            for module, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Each set of modules that import one another round a circle (a strongly connected component of
    two or more), as its sorted names (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(tuple(sorted(component)))
    return found


def test_no_import_circle_in_the_package():
    found = circles(import_graph(ROOT))
    assert found == set(), "an import circle: the lower module must not import the higher"


def test_the_circle_finder_sees_a_circle_and_passes_layers():
    """Negative control: a circle of three, a pair, and the layers beside them that are no circle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(),
             "e": {"f", "d"}, "f": {"e"}, "g": {"a", "d"}}
    assert circles(graph) == {("a", "b", "c"), ("e", "f")}
    assert circles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == set()


def test_the_import_graph_counts_every_kind_of_import(tmp_path):
    """Negative control on files: a circle closed by a lazy import, and one closed under TYPE_CHECKING,
    are circles; ``from package import name`` reaches the module ``name``."""
    package = tmp_path / "placeenv"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "cli.py").write_text("def main():\n    from .server import serve\n")
    (package / "server.py").write_text("from .cli import ready_message\n")
    (package / "control.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from .sub.engine import Engine\n")
    (package / "sub" / "engine.py").write_text("from .. import control\n")
    (package / "low.py").write_text("import placeenv.sub\n")
    assert circles(import_graph(tmp_path)) == {("placeenv.cli", "placeenv.server"),
                                               ("placeenv.control", "placeenv.sub.engine")}


# -- sizes: a module a newcomer reads whole, a function they hold in their head --------------------------

MODULE_LINES = 500  # a module of the service
FUNCTION_LINES = 60  # a function of placeenv/, from its def (or first decorator) to its last line



def long_parts(source: str, path: str, module_limit: int | None) -> set[str]:
    """``path`` where the module is over ``module_limit`` lines, and ``path:Class.function`` for each
    function over ``FUNCTION_LINES``."""
    found = set()
    if module_limit is not None and len(source.splitlines()) > module_limit:
        found.add(path)

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                if child.end_lineno - first + 1 > FUNCTION_LINES:
                    found.add(f"{path}:{prefix}{child.name}")
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return found


def test_no_module_of_the_service_and_no_function_of_the_package_is_over_its_length():
    found = set()
    for path in python_files("placeenv"):
        name = relative(path)
        limit = MODULE_LINES if name.startswith("placeenv/serve/") else None
        found |= long_parts(path.read_text(), name, limit)
    assert found == set(), "over the limit: split it along its seams"


def test_the_length_scanner_sees_a_long_module_and_long_functions_and_passes_short_ones():
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES - 1))
    source = (f"def short():\n{body}\n\n"
              f"@decorated\ndef long():\n{body}\n\n"
              "class Kind:\n    def method(self):\n" + "\n".join("    " + line for line in body.splitlines())
              + "\n        y = 1\n\n"
              "    def fine(self):\n        pass\n")
    assert long_parts(source, "m.py", None) == {"m.py:long", "m.py:Kind.method"}
    assert long_parts(source, "m.py", 10) == {"m.py", "m.py:long", "m.py:Kind.method"}
    assert long_parts(source, "m.py", 10_000) == {"m.py:long", "m.py:Kind.method"}


# -- the engine's shape: a worker that is a loop, one way a job is made, no hidden thread state -------------

WORKER_METHODS, WORKER_ATTRIBUTES = 8, 10


def class_size(source: str, name: str) -> tuple[int, set[str]]:
    """Class ``name``'s methods (every ``def`` in its body, ``__init__`` too) and the attributes its methods
    set on ``self``."""
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == name)
    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    attributes = set()
    for method in methods:
        for target in ast.walk(method):
            if isinstance(target, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for found in (target.targets if isinstance(target, ast.Assign) else [target.target]):
                    for item in ast.walk(found):
                        if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                                and item.value.id == "self":
                            attributes.add(item.attr)
    return len(methods), attributes


def test_the_worker_is_a_loop_of_few_methods_and_attributes():
    methods, attributes = class_size((ROOT / "placeenv/serve/engine/worker.py").read_text(), "Worker")
    assert methods <= WORKER_METHODS, f"Worker has {methods} methods: move a concern into a unit of its own"
    assert len(attributes) <= WORKER_ATTRIBUTES, sorted(attributes)


def test_the_class_size_scanner_counts_methods_and_self_attributes():
    source = ("class Worker:\n    def __init__(self):\n        self.a, self.b = 1, 2\n        self.c: int = 3\n"
              "        other.d = 4\n    def run(self):\n        self.e += 1\n        self.a = 5\n"
              "    async def later(self):\n        pass\n")
    assert class_size(source, "Worker") == (3, {"a", "b", "c", "e"})


def constructed(source: str, name: str) -> int:
    """How many calls of ``name(...)`` ``source`` makes."""
    return sum(1 for n in ast.walk(ast.parse(source))
               if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name)


def test_a_job_is_made_once_at_admission_and_every_other_is_derived_from_one():
    """``Job(...)`` only in path.py, where a request is admitted; a part (forward.split) is a
    ``dataclasses.replace`` of its job, so no field is copied by name and a new one reaches it."""
    found = {relative(path): count for path in python_files("placeenv/serve")
             if (count := constructed(path.read_text(), "Job"))}
    assert found == {"placeenv/serve/engine/path.py": 1}, found


def test_the_job_scanner_sees_a_job_made_field_by_field():
    assert constructed("part = Job(model=job.model, inputs=inputs)\nkind = Job\n", "Job") == 1
    assert constructed("part = dataclasses.replace(job, inputs=inputs)\n", "Job") == 0


def thread_locals(source: str) -> list[str]:
    """Classes that subclass ``threading.local`` (or ``local``), and names bound to ``threading.local()``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        bases = node.bases if isinstance(node, ast.ClassDef) else [node.value.func] if isinstance(
            node, ast.Assign) and isinstance(node.value, ast.Call) else []
        if any(ast.unparse(base) in ("threading.local", "local") for base in bases):
            found.append(node.name if isinstance(node, ast.ClassDef) else ast.unparse(node.targets[0]))
    return found


def test_no_thread_local_state_in_the_service():
    """What a model's code reads of its request is set by a token pair (``models/base.py``'s ``serving``),
    never a thread-local that two places save and restore."""
    found = {relative(path): names for path in python_files("placeenv/serve")
             if (names := thread_locals(path.read_text()))}
    assert found == {}, found


def test_the_thread_local_scanner_sees_a_subclass_and_an_instance():
    source = "import threading\nclass Calls(threading.local):\n    x = 1\nSTATE = threading.local()\ny = f()\n"
    assert thread_locals(source) == ["Calls", "STATE"]


FROZEN = {"Generation", "ServedVersion", "ServedPipeline"}
#: What a structure outside the generation would call its own list of what is served.
SERVED_LISTS = {"models", "held", "replicas", "entries", "uniform", "backends", "choices"}


def frozen_dataclasses(source: str) -> set[str]:
    """The classes of ``source`` decorated ``@dataclasses.dataclass(frozen=True, ...)``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("dataclass") and any(
                        k.arg == "frozen" and getattr(k.value, "value", False) is True for k in decorator.keywords):
                    found.add(node.name)
    return found


def test_what_is_served_is_in_the_generation_alone_and_frozen():
    engine = ROOT / "placeenv/serve/engine"
    assert FROZEN <= frozen_dataclasses((engine / "generation.py").read_text())
    kept = {}
    for module, name in (("dispatch.py", "DeviceQueue"), ("worker.py", "Worker"), ("workers.py", "WorkerPool"),
                         ("calls.py", "Calls"), ("replica.py", "Holding")):
        _, attributes = class_size((engine / module).read_text(), name)
        if name == "Holding":  # what its worker loads at the service's start, before any generation is built
            attributes.discard("entries")
        if attributes & SERVED_LISTS:
            kept[name] = sorted(attributes & SERVED_LISTS)
    assert kept == {}, f"keeps its own list of what is served (derive it from the generation): {kept}"


def test_the_frozen_scanner_sees_frozen_and_not():
    source = ("import dataclasses\n@dataclasses.dataclass(frozen=True, eq=False)\nclass A:\n    x: int\n"
              "@dataclasses.dataclass\nclass B:\n    x: int\n@dataclasses.dataclass(frozen=False)\nclass C:\n    x: int\n")
    assert frozen_dataclasses(source) == {"A"}
