"""Every public name works as a user's first line: before ``import paddle``, after it,
and after ``placeenv.sim.prepare()``; each case in a fresh interpreter.

A case runs the name's own snippet first (it must be the first placeenv code
the interpreter sees), then one check of the result: the name did its job,
placeenv is installed, and two threads pinned to sim:1 and sim:2 each see
their own device on both of Paddle's levels while the main thread keeps
sim:0. ``uninstall`` is the negative control: the same check sees stock
Paddle's leak.
"""

from __future__ import annotations

import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from placeenv.testing import run_with_sim

#: name -> the user's code, ending with a JSON-able ``used`` to check.
USES = {
    "PlaceEnv": """
        from placeenv import PlaceEnv
        env = PlaceEnv("sim:1")
        import paddle
        with env:
            used = str(paddle.ones([1]).place)
    """,
    "ScopeError": """
        from placeenv import PlaceEnv, ScopeError
        outer, inner = PlaceEnv("sim:1"), PlaceEnv("sim:2")
        import paddle
        outer.__enter__()
        inner.__enter__()
        try:
            outer.__exit__(None, None, None)  # out of order: refused, nothing changes
        except ScopeError as error:
            used = [type(error).__mro__[1].__name__, "out of order" in str(error), paddle.get_device()]
        inner.__exit__(None, None, None)
        outer.__exit__(None, None, None)
        used.append(paddle.get_device())
    """,
    "UnsupportedPaddleError": """
        from placeenv import UnsupportedPaddleError
        used = UnsupportedPaddleError.__mro__[1].__name__
    """,
    "aio": """
        from placeenv import aio
        import asyncio
        import numpy as np
        async def main():
            aio.install()
            import paddle
            from placeenv import PlaceEnv
            async def task(device):
                with PlaceEnv(device):
                    await asyncio.sleep(0)
                    return str(paddle.Tensor(np.ones(1, "float32")).place)
            return await asyncio.gather(task("sim:1"), task("sim:2"))
        used = asyncio.run(main())
    """,
    "aio.install": """
        import placeenv.aio
        import asyncio
        async def main():
            placeenv.aio.install()
            return asyncio.get_running_loop().get_task_factory() is placeenv.aio.task_factory
        used = asyncio.run(main())
    """,
    "aio.task_factory": """
        import asyncio
        from placeenv.aio import task_factory
        import numpy as np
        async def main():
            asyncio.get_running_loop().set_task_factory(task_factory)
            import paddle
            from placeenv import PlaceEnv
            async def task(device):
                with PlaceEnv(device):
                    await asyncio.sleep(0)
                    return str(paddle.Tensor(np.ones(1, "float32")).place)
            return await asyncio.gather(task("sim:2"), task("cpu"))
        used = asyncio.run(main())
    """,
    "available_devices": """
        import placeenv
        used = placeenv.available_devices()
    """,
    "bind": """
        from placeenv import bind
        from concurrent.futures import ThreadPoolExecutor
        def work():
            import paddle
            return str(paddle.ones([1]).place)
        with ThreadPoolExecutor(1) as pool:
            import placeenv
            with placeenv.PlaceEnv("sim:2"):
                used = pool.submit(bind(work)).result()
    """,
    "current_place": """
        import placeenv
        used = str(placeenv.current_place())
    """,
    "device_name": """
        from placeenv import device_name
        import paddle
        used = device_name(paddle.CustomPlace("sim", 3))
    """,
    "install": """
        import placeenv, sys
        placeenv.install()
        used = "paddle" in sys.modules
    """,
    "installed": """
        import placeenv
        before = placeenv.installed()
        import paddle
        used = [before, placeenv.installed()]
    """,
    "prepare_devices": """
        import placeenv
        placeenv.prepare_devices()
        import paddle
        used = [paddle.in_dynamic_mode(), str(paddle.ones([1]).place)]
    """,
    "to_place": """
        from placeenv import to_place
        used = str(to_place("sim:2"))
    """,
    "uninstall": """
        import placeenv
        placeenv.uninstall()
        import paddle
        used = [placeenv.installed(), hasattr(paddle, "PlaceEnv")]
    """,
}

#: name -> what ``used`` must be (a callable of the order where it depends on it).
EXPECTED = {
    "PlaceEnv": "Place(sim:1)",
    "ScopeError": ["RuntimeError", True, "sim:2", "sim:0"],
    "UnsupportedPaddleError": "RuntimeError",
    "aio": ["Place(sim:1)", "Place(sim:2)"],
    "aio.install": True,
    "aio.task_factory": ["Place(sim:2)", "Place(cpu)"],
    "available_devices": ["cpu", "sim:0", "sim:1", "sim:2", "sim:3"],
    "bind": "Place(sim:2)",
    "current_place": "Place(sim:0)",
    "device_name": "sim:3",
    "install": True,
    "installed": lambda order: [order == "after paddle", True],
    "prepare_devices": [True, "Place(sim:0)"],
    "to_place": "Place(sim:2)",
    "uninstall": [False, False],
}

ORDERS = {
    # Sim devices come from the environment (`eval "$(python -m placeenv.sim env)"`).
    "before paddle": ("", True),
    "after paddle": ("import paddle\n", True),
    # The process loads the plugin itself.
    "after sim.prepare": ("import placeenv.sim\nplaceenv.sim.prepare(4)\n", False),
}

CHECK = """
import json, threading
import numpy as np
import paddle, placeenv
from placeenv import device_name

def levels():
    return [paddle.get_device(), device_name(paddle.ones([1]).place),
            device_name(paddle.Tensor(np.ones(1, "float32")).place)]

seen, errors, barrier = {}, [], threading.Barrier(2)

def worker(device):
    try:
        paddle.set_device(device)
        barrier.wait()  # both have set a device: stock Paddle now has the last one for both
        seen[device] = levels()
    except BaseException as error:
        errors.append(repr(error))

threads = [threading.Thread(target=worker, args=(d,)) for d in ("sim:1", "sim:2")]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"used": used, "installed": placeenv.installed(), "seen": seen,
                  "main": levels(), "errors": errors}))
"""

CASES = [(name, order) for name in USES for order in ORDERS]


def test_every_public_name_is_covered():
    import placeenv.aio

    assert set(USES) == set(placeenv.__all__) | {f"aio.{n}" for n in placeenv.aio.__all__}


@pytest.fixture(scope="module")
def results():
    """All cases, run four interpreters at a time (each one is a fresh `python -c`)."""
    def run(case):
        name, order = case
        prefix, env_devices = ORDERS[order]
        code = prefix + textwrap.dedent(USES[name]) + CHECK
        return run_with_sim(code, devices=4, prepare=env_devices, check=False, timeout=180)

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(CASES, pool.map(run, CASES)))


@pytest.mark.parametrize("name, order", CASES)
def test_name_works_in_this_import_order(results, name, order):
    result = results[(name, order)]
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.json()
    expected = EXPECTED[name]
    assert out["used"] == (expected(order) if callable(expected) else expected)
    assert out["errors"] == []
    isolated = {"sim:1": ["sim:1"] * 3, "sim:2": ["sim:2"] * 3}
    if name == "uninstall":  # negative control: stock Paddle, and the check sees its leak
        assert out["installed"] is False
        assert out["seen"] != isolated
    else:
        assert out["installed"] is True
        assert out["seen"] == isolated
        assert out["main"] == ["sim:0"] * 3
    assert "Traceback" not in result.stderr
