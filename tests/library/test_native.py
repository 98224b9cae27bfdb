"""A Predictor's run without the GIL (placeenv.native): the same answers as the binding's run, other
threads running through it where the binding's run stops them (the negative control), Paddle's errors
raised as the binding raises them with the process going on, and a clear reason wherever it cannot be
had (switched off, no compiler, not a Predictor)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from support.models import Convs
from support.threads import longest_stall

from placeenv import PlaceEnv, native
from placeenv.tensors import host_view

ROOT = Path(__file__).resolve().parents[2]


class Upsampled(paddle.nn.Layer):
    """Twice the size by a scale factor: a program Paddle 3.3's oneDNN executor builds but cannot run."""

    def forward(self, x):
        return paddle.nn.functional.interpolate(x, scale_factor=2, mode="nearest")


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("programs")
    paddle.seed(0)
    spec = [paddle.static.InputSpec([None, 3, None, None], "float32", "x")]
    with PlaceEnv("cpu"):
        for name, layer in (("convs", Convs()), ("upsampled", Upsampled())):
            layer.eval()
            paddle.jit.save(layer, str(root / name / "model"), input_spec=spec)
    return {name: root / name / "model" for name in ("convs", "upsampled")}


def predictor(program: Path, onednn: bool = False, threads: int = 1):
    config = paddle.inference.Config(str(program.with_suffix(".json")), str(program.with_suffix(".pdiparams")))
    config.disable_gpu()
    config.disable_glog_info()
    config.set_cpu_math_library_num_threads(threads)
    config.enable_mkldnn() if onednn else config.disable_mkldnn()
    return paddle.inference.create_predictor(config)


def bind(p, x: np.ndarray) -> None:
    p.get_input_handle(p.get_input_names()[0]).copy_from_cpu(x)


def output(p) -> np.ndarray:
    return p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()


def test_a_run_without_the_gil_answers_as_the_bindings_run(programs):
    assert native.unavailable() is None
    p = predictor(programs["convs"])
    run = native.runner(p)
    for shape in ((1, 3, 32, 48), (3, 3, 17, 9)):
        x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
        bind(p, x)
        p.run()
        expected = output(p)
        bind(p, np.zeros_like(x))
        p.run()
        bind(p, x)
        run()
        np.testing.assert_array_equal(output(p), expected)


def test_other_threads_run_through_a_run_without_the_gil_and_not_through_the_bindings(programs):
    p = predictor(programs["convs"])
    bind(p, np.random.default_rng(0).standard_normal((1, 3, 256, 256)).astype(np.float32))
    run = native.runner(p)
    p.run()  # built, allocated
    free, held = [], []
    for _ in range(5):  # interleaved: a busy machine slows both alike
        stall, seconds = longest_stall(run)
        free.append(stall / seconds)
        stall, seconds = longest_stall(p.run)
        held.append(stall / seconds)
    # The negative control: through the binding's run the thread waits for all of it.
    assert statistics.median(held) > 0.8, (free, held)
    assert statistics.median(free) < 0.5, (free, held)


def test_a_failing_run_raises_what_the_binding_raises_and_the_process_goes_on(programs):
    x = np.ones((1, 3, 8, 8), np.float32)
    failing = predictor(programs["upsampled"], onednn=True)
    bind(failing, x)
    with pytest.raises(NotImplementedError) as binding:
        failing.run()
    run = native.runner(failing)
    with pytest.raises(NotImplementedError) as ours:
        run()
    assert "ConvertPirAttribute2RuntimeAttribute" in str(ours.value)
    assert str(ours.value).splitlines()[0] == str(binding.value).strip().splitlines()[0]
    working = predictor(programs["upsampled"])
    bind(working, x)
    native.runner(working)()
    assert output(working).shape == (1, 3, 16, 16)


@pytest.mark.parametrize("message, kind", [
    ("(InvalidArgument) the input's rank is 3", ValueError),
    ("(Unimplemented) no kernel", NotImplementedError),
    ("(ResourceExhausted) out of memory", MemoryError),
    ("(PreconditionNotMet) not initialized", RuntimeError),
    ("C++ Traceback (most recent call last):\n0 Run\nInvalidArgumentError: the rank is 3", ValueError),
    ("something else", native.PredictorRunError),
])
def test_paddles_error_categories_become_the_bindings_exceptions(message, kind):
    error = native.error(message)
    assert type(error) is kind and str(error) == message


def test_a_host_view_is_the_arrays_memory_in_its_shape():
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    view = host_view(array)
    assert view.shape == [2, 3] and view.dtype == paddle.int64 and view.data_ptr() == array.ctypes.data
    assert host_view(np.float32(2.5)).shape == []  # a 0-d output stays 0-d


def test_what_is_not_a_predictor_gets_a_reason():
    assert "not one whose C++ object" in native.runner(object())


@pytest.mark.parametrize("environment, says", [
    ({native.SWITCH: "0"}, "turned off"),
    ({"CXX": "false", "PLACEENV_NATIVE_CACHE": "{tmp}"}, "could not be built"),
])
def test_a_process_without_it_says_why_and_keeps_the_bindings_run(environment, says, tmp_path):
    """In a fresh interpreter: switched off, or with a compiler that fails (and an empty cache)."""
    env = {**os.environ, **{k: v.format(tmp=tmp_path) for k, v in environment.items()}, "PYTHONPATH": str(ROOT)}
    script = "import paddle\nfrom placeenv import native\nprint(native.unavailable())\n"
    found = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr[-2000:]
    assert says in found.stdout, found.stdout
