"""install / uninstall, the version guard, import order and the sim plugin itself."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import paddle
import pytest

import placeenv
from placeenv import _internals
from support import run_threads, where


def _code_objects():
    return {name: _internals.code_owner(name).__code__ for name in _internals.CODE_TARGETS}


def _methods():
    methods = {(cls, m): cls.__dict__[m] for cls, _ in _internals.guard_classes for m in ("__enter__", "__exit__")}
    methods.update({(cls, m): cls.__dict__[m] for cls, m in _internals.method_targets})
    return methods


def test_uninstall_restores_exactly_and_round_trips():
    placeenv.uninstall()
    stock_code, stock_methods = _code_objects(), _methods()
    modules = {_internals.code_owner(n).__module__ for n in _internals.CODE_TARGETS}
    assert modules == {"paddle.base.framework", "paddle.device", "paddle.tensor.creation"}
    module_names = {m: set(vars(sys.modules[m])) for m in modules}
    assert not placeenv.installed()
    assert not hasattr(paddle, "PlaceEnv") and not hasattr(paddle.device, "PlaceEnv")

    placeenv.install()
    placeenv.install()  # idempotent
    assert placeenv.installed()
    assert all(_code_objects()[n] is not stock_code[n] for n in stock_code)
    assert paddle.PlaceEnv is placeenv.PlaceEnv

    placeenv.uninstall()
    placeenv.uninstall()  # idempotent
    assert _code_objects() == stock_code  # the very same code objects
    assert _methods() == stock_methods
    assert {m: set(vars(sys.modules[m])) for m in modules} == module_names  # injected helpers gone

    # Stock behaviour is back: a child thread's set_device moves the main thread.
    paddle.set_device("sim:3")
    run_threads(lambda: paddle.set_device("sim:1"))
    assert paddle.get_device() == "sim:1"

    placeenv.install()
    paddle.set_device("sim:3")
    run_threads(lambda: paddle.set_device("sim:1"))
    assert paddle.get_device() == "sim:3"


def test_version_guard():
    _internals.check_version("3.3.1")
    with pytest.raises(_internals.UnsupportedPaddleError, match="tested with Paddle 3.3.x; this is Paddle 3.4.0"):
        _internals.check_version("3.4.0")


def test_version_guard_override(monkeypatch):
    monkeypatch.setenv(_internals.ALLOW_UNTESTED_ENV, "1")
    with pytest.warns(RuntimeWarning, match="3.9.0"):
        _internals.check_version("3.9.0")


def test_import_placeenv_before_paddle_installs_on_paddle_import(sim_run):
    out = sim_run(
        """
        import sys, json, placeenv
        before = "paddle" in sys.modules
        import paddle
        print(json.dumps([before, placeenv.installed(), hasattr(paddle, "PlaceEnv")]))
        """
    ).json()
    assert out == [False, True, True]


def test_import_placeenv_after_paddle_installs_at_once(sim_run):
    out = sim_run("import json, paddle, placeenv; print(json.dumps(placeenv.installed()))").json()
    assert out is True


def test_untested_paddle_version_fails_clearly(sim_run):
    result = sim_run(
        """
        import paddle
        paddle.__version__ = "9.0.0"
        import placeenv
        """,
        check=False,
    )
    assert result.returncode != 0
    assert "tested with Paddle 3.3.x; this is Paddle 9.0.0" in result.stderr


def test_missing_internal_is_named_not_an_attribute_error(sim_run):
    """An allowed-but-untested Paddle that lacks an internal gets one error naming what is missing."""
    result = sim_run(
        f"""
        import os, paddle
        os.environ["{_internals.ALLOW_UNTESTED_ENV}"] = "1"
        paddle.__version__ = "3.9.0"
        del paddle.base.framework._dygraph_place_guard
        del paddle.base.core.Tracer._expected_place
        import placeenv
        """,
        check=False,
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("placeenv._internals.UnsupportedPaddleError: Paddle 3.9.0 lacks internals placeenv uses:")
    assert "paddle.base.framework._dygraph_place_guard" in last and "Tracer()._expected_place" in last
    assert "AttributeError" not in result.stderr


def test_unsupported_paddle_at_import_hook_keeps_paddle_working(sim_run):
    """Armed before `import paddle`: the import still works (stock), and placeenv's API raises the error."""
    out = sim_run(
        """
        import json, warnings
        import placeenv, placeenv._internals as internals
        internals.TESTED_PADDLE = ("9.9",)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import paddle
        x = paddle.ones([2])  # stock Paddle works
        try:
            placeenv.PlaceEnv("cpu")
            error = None
        except placeenv.UnsupportedPaddleError as exc:
            error = str(exc)
        print(json.dumps({"warned": [str(w.message) for w in caught if "placeenv" in str(w.message)],
                          "installed": placeenv.installed(), "patched": hasattr(paddle, "PlaceEnv"),
                          "error": error}))
        """
    ).json()
    assert len(out["warned"]) == 1 and "placeenv is not installed" in out["warned"][0]
    assert out["installed"] is False and out["patched"] is False
    assert "tested with Paddle 9.9.x" in out["error"]


@pytest.mark.parametrize("reinstall", [False, True], ids=["uninstalled", "reinstalled"])
def test_scope_left_open_across_uninstall_exits_cleanly(reinstall):
    """A child's scope outlives an uninstall() (and a re-install) done by the main thread; when it
    exits, the child is back on Paddle's shared Tracer: a later device move of the main thread
    reaches the child's C++ level."""
    entered, uninstalled, exited, moved = (threading.Event() for _ in range(4))
    seen = {}

    def child():
        paddle.ones([1])
        with placeenv.PlaceEnv("sim:2"):
            seen["inside"] = where(paddle.Tensor(np.ones(1, "float32")))
            entered.set()
            assert uninstalled.wait(30)
        exited.set()
        assert moved.wait(30)
        seen["after"] = (paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32"))))

    thread = threading.Thread(target=child)
    errors = []
    thread.run = lambda run=thread.run: _record_errors(run, errors)
    thread.start()
    assert entered.wait(30)
    placeenv.uninstall()
    if reinstall:
        placeenv.install()
    uninstalled.set()
    assert exited.wait(30)
    paddle.set_device("sim:3")  # stock: the global device and the shared Tracer
    moved.set()
    thread.join(30)
    assert not thread.is_alive(), "the thread did not finish"
    assert not errors, errors
    assert seen["inside"] == "sim:2"
    assert seen["after"] == ("sim:3",) * 3


def _record_errors(run, errors):
    try:
        run()
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)
        raise


@pytest.mark.parametrize("in_thread", [False, True], ids=["main", "child"])
def test_scope_entered_on_stock_exits_cleanly_after_install(in_thread):
    placeenv.uninstall()
    paddle.set_device("sim:0")
    seen = {}

    def body():
        with placeenv.PlaceEnv("sim:3"):  # stock: moves the global device (and the shared Tracer)
            placeenv.install()
            seen["inside"] = paddle.get_device()
        seen["after"] = (paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32"))))

    run_threads(body) if in_thread else body()
    assert seen["inside"] == "sim:3"
    assert seen["after"] == ("sim:0",) * 3
    assert (paddle.get_device(), where(paddle.Tensor(np.ones(1, "float32")))) == ("sim:0", "sim:0")


def test_uninstall_with_threads_on_private_tracers():
    """uninstall()'s definition for a thread that still holds a device of its own (its docstring)."""
    from placeenv import state

    baseline = state.private_tracers()
    ready, go, done = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def worker():
        paddle.set_device("sim:2")
        seen["own"] = (paddle.get_device(), where(paddle.Tensor(np.ones(1, "float32"))))
        ready.set()
        go.wait(30)
        # Re-aimed at the global device: both levels agree, as on stock Paddle.
        seen["released"] = (paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32"))))
        paddle.set_device("sim:1")  # stock semantics now: this moves the global device
        seen["stock set"] = (paddle.get_device(), where(paddle.Tensor(np.ones(1, "float32"))))
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    assert ready.wait(30)
    assert state.private_tracers() == baseline + 1
    placeenv.uninstall()
    go.set()
    thread.join(30)
    assert not thread.is_alive(), "the thread did not finish"
    assert done.is_set(), seen
    assert seen["own"] == ("sim:2", "sim:2")
    assert seen["released"] == ("sim:0",) * 3
    assert seen["stock set"] == ("sim:1", "sim:1")
    assert paddle.get_device() == "sim:1"  # the main thread moved with it: stock Paddle
    gc.collect()
    assert state.private_tracers() == 0  # uninstall forgets them; the thread's own died with it


def test_first_import_in_one_thread_and_first_use_in_another_do_not_deadlock():
    """Thread B's `import paddle` runs placeenv's import hook while thread A asks placeenv for devices."""
    code = """
import sys, threading
import placeenv
done = []
a = threading.Thread(target=lambda: done.append(placeenv.available_devices()))
b = threading.Thread(target=lambda: __import__("paddle"))
b.start(); a.start()
a.join(60); b.join(60)
print("hung" if a.is_alive() or b.is_alive() else done[0])
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("['cpu'")


def test_sim_device_without_the_plugin_says_how_to_load_it():
    code = """
import json, paddle, placeenv
messages = []
for attempt in (lambda: placeenv.PlaceEnv("sim:0"), lambda: paddle.set_device("sim:0")):
    try:
        attempt()
    except ValueError as exc:
        messages.append(str(exc))
print(json.dumps(messages))
"""
    env = {k: v for k, v in os.environ.items() if k != "CUSTOM_DEVICE_ROOT"}  # this session loaded the plugin
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(out) == 2
    for message in out:
        assert "placeenv.sim.prepare(devices=N) before the first `import paddle`" in message
        assert 'eval "$(python -m placeenv.sim env --devices N)"' in message
    assert "no device type 'sim'" in out[0] and "available devices: cpu" in out[0]
    assert out[1].startswith("The device must be a string")  # Paddle's own message comes first


def test_set_device_keeps_its_errors_for_other_devices():
    with pytest.raises(ValueError, match="The device must be a string") as err:
        paddle.set_device("npu:0")
    assert "placeenv.sim" not in str(err.value)


def test_threads_that_touched_paddle_before_install_are_handled(sim_run):
    out = sim_run(
        """
        import json, threading
        import numpy as np
        import paddle
        paddle.set_device("sim:3")
        go, done = threading.Event(), threading.Event()
        seen = {}
        def early():
            paddle.ones([1])                       # touched Paddle before placeenv
            go.wait()
            seen["inherit"] = str(paddle.Tensor(np.ones(1, "float32")).place)
            paddle.set_device("sim:1")
            seen["own"] = (paddle.get_device(), str(paddle.Tensor(np.ones(1, "float32")).place))
        t = threading.Thread(target=early); t.start()
        import placeenv
        go.set(); t.join()
        seen["main"] = (paddle.get_device(), str(paddle.Tensor(np.ones(1, "float32")).place))
        print(json.dumps(seen))
        """
    ).json()
    assert out == {"inherit": "Place(sim:3)", "own": ["sim:1", "Place(sim:1)"], "main": ["sim:3", "Place(sim:3)"]}


def test_prepare_after_paddle_import_is_a_clear_error():
    from placeenv import sim

    with pytest.raises(sim.SimSetupError, match=r"before `import paddle`"):
        sim.prepare(2)


def test_sim_device_count_and_data(sim_run):
    out = sim_run(
        """
        import json, numpy as np, paddle
        x = np.arange(12, dtype="float32").reshape(3, 4)
        t = paddle.to_tensor(x, place="sim:1")
        moved = t.to("sim:0").to("cpu").numpy()
        print(json.dumps({
            "devices": paddle.device.get_available_device(),
            "default": paddle.get_device(),
            "roundtrip": bool((moved == x).all()),
            "view": t.T[:, 1].numpy().tolist(),
            "matmul": (t @ t.T).numpy().tolist() == (x @ x.T).tolist(),
        }))
        """,
        devices=2,
    ).json()
    assert out["devices"] == ["sim:0", "sim:1"]
    assert out["default"] == "sim:0"
    assert out["roundtrip"] and out["matmul"]
    assert out["view"] == [4.0, 5.0, 6.0, 7.0]


def test_sim_env_cli_names_the_python_that_lacks_paddle(tmp_path):
    """`eval "$(python -m placeenv.sim env)"` with the wrong Python: the error names it, and the eval fails."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=str(Path(placeenv.__file__).parent.parent))
    result = subprocess.run(
        ["bash", "-c", f'eval "$({python} -m placeenv.sim env --devices 2)"; echo "eval=$?"'],
        capture_output=True, text=True, env=env,
    )
    assert f"this Python ({python}, " in result.stderr
    assert "has no paddle" in result.stderr
    assert result.stdout.strip() == "eval=1"


def test_sim_env_cli_prints_exports():
    result = subprocess.run(
        [sys.executable, "-m", "placeenv.sim", "env", "--devices", "3"], capture_output=True, text=True, check=True
    )
    lines = dict(line.removeprefix("export ").split("=", 1) for line in result.stdout.splitlines())
    assert lines["PLACEENV_SIM_DEVICES"] == "3"
    assert lines["FLAGS_use_stride_kernel"] == "0"
    assert lines["CUSTOM_DEVICE_ROOT"].strip("'")
    bad = subprocess.run([sys.executable, "-m", "placeenv.sim", "env", "--devices", "0"], capture_output=True, text=True)
    assert bad.returncode == 1 and "between 1 and 64" in bad.stderr


def test_sim_devices_are_distinct_places():
    a = paddle.ones([2], device="sim:1")
    b = paddle.ones([2], device="sim:2")
    assert (where(a), where(b)) == ("sim:1", "sim:2")
    assert placeenv.available_devices() == ["cpu", "sim:0", "sim:1", "sim:2", "sim:3"]
    np.testing.assert_array_equal((a + 1).numpy(), [2.0, 2.0])


def test_placeenv_after_uninstall_acts_like_paddles_own_guard(stock):
    """Uninstalled, PlaceEnv is Paddle's set/restore: it works, and leaks, like stock code."""
    with placeenv.PlaceEnv("cpu"):
        assert paddle.get_device() == "cpu"
        seen = []
        run_threads(lambda: seen.append(paddle.get_device()))
        assert seen == ["cpu"]  # the global moved: stock semantics
    assert paddle.get_device() == "sim:0"

    @placeenv.PlaceEnv("sim:2")
    def gen():
        yield paddle.get_device()

    assert list(gen()) == ["sim:2"]
    assert paddle.get_device() == "sim:0"


def test_install_runs_its_event_pool_program_leaving_no_trace(sim_run):
    # install() runs one tiny static program per custom device type, so that two threads' first
    # program runs do not race in Paddle's unlocked event-pool map (benchmarks/first_run_race.py
    # measures that race). It must leave no trace a user sees: the mode, the device, the user's
    # static programs (in static mode too) and its global scope.
    out = sim_run(
        """
        import json, paddle
        paddle.enable_static()
        main, startup = paddle.static.default_main_program(), paddle.static.default_startup_program()
        before = [len(main.global_block().ops), len(startup.global_block().ops)]
        import placeenv
        static = [len(main.global_block().ops), len(startup.global_block().ops), paddle.in_dynamic_mode()]
        print(json.dumps([placeenv.installed(), before, static]))
        """
    ).json()
    assert out == [True, [0, 0], [0, 0, False]]
    out = sim_run(
        """
        import json, paddle
        device = paddle.get_device()
        main = paddle.static.default_main_program()
        import placeenv
        print(json.dumps([paddle.in_dynamic_mode(), paddle.get_device() == device,
                          len(main.global_block().ops), paddle.static.default_main_program() is main,
                          paddle.static.global_scope().local_var_names()]))
        """
    ).json()
    assert out == [True, True, 0, True, []]


def test_prepare_devices_on_stock_paddle_leaves_no_trace(sim_run):
    # What install() does against Paddle's unlocked first-use maps, for a program on stock Paddle
    # (the service's isolation off): the same no-trace promise, and a thread born after it still
    # gets the Tracer (stock Paddle hands every new thread the one it finds).
    out = sim_run(
        """
        import json, threading, paddle, placeenv
        placeenv.uninstall()
        device = paddle.get_device()
        main = paddle.static.default_main_program()
        placeenv.prepare_devices()
        found = {}
        thread = threading.Thread(target=lambda: found.update(mode=paddle.in_dynamic_mode()))
        thread.start(); thread.join()
        print(json.dumps([placeenv.installed(), paddle.in_dynamic_mode(), found["mode"],
                          paddle.get_device() == device, len(main.global_block().ops),
                          paddle.static.default_main_program() is main,
                          paddle.static.global_scope().local_var_names()]))
        """
    ).json()
    assert out == [False, True, True, True, 0, True, []]
