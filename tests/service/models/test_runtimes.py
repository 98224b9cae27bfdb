"""ONNX Runtime and OpenVINO as backends of a Paddle export (models/runtimes.py), and ``backend: auto``'s
measured choice (models/choice.py).

Replicas are made as a worker makes them (``engine.standalone``, or a device's workers sharing one
``DeviceShare``). Each runtime's answers are the Predictor's; the conversion is kept by the export's content,
and one that fails is a reason; ``auto`` serves the fastest backend whose outputs agree, and its negative
control is a converted model made wrong on purpose, which it passes over. A runtime's runs leave the GIL
(the negative control: the binding's Predictor run, which holds it). Over HTTP, the config and statistics
say which backend serves and why.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading

import httpx
import numpy as np
import onnx
import paddle
import pytest
from onnx import numpy_helper
from support.models import TWO_KINDS_SPEC, Convs, TwoKinds, device_workers, hammer, replica_of, run
from support.polling import wait_until
from support.servers import ServiceProcess
from support.threads import longest_stall

from placeenv import PlaceEnv
from placeenv.serve.models import choice, inference, runtimes, scan
from placeenv.tensors import host_tensor

RNG = np.random.default_rng(0)


class Unconvertible(paddle.nn.Layer):
    """An op paddle2onnx 2.1 has no converter for (histogram)."""

    def forward(self, x):
        return x + paddle.histogram(x, bins=4).astype("float32")[0]


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    """A conversion cache of this module's own: a test spoils what is in it."""
    directory = tmp_path_factory.mktemp("onnx-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PLACEENV_ONNX_CACHE", str(directory))
        yield directory


@pytest.fixture(scope="module")
def repository(tmp_path_factory, onnx_cache):
    """``two-<backend>`` for each backend, ``convs-<backend>``, ``histogram-<backend>``: one export each,
    with a config naming the backend."""
    root = tmp_path_factory.mktemp("repository")
    paddle.seed(0)
    with PlaceEnv("cpu"):
        for name, layer, spec in (
                ("two", TwoKinds(), TWO_KINDS_SPEC),
                ("convs", Convs(), [paddle.static.InputSpec([None, 3, -1, -1], "float32", "x")]),
                ("histogram", Unconvertible(), [paddle.static.InputSpec([None, 4], "float32", "x")])):
            layer.eval()
            paddle.jit.save(layer, str(root / "export" / name / "model"), input_spec=spec)
            for backend in ("auto", "inference", "onnxruntime", "openvino"):
                shutil.copytree(root / "export" / name, root / f"{name}-{backend}" / "1")
                # A runtime has no provider on sim: the service loads it on the CPU's workers only.
                config = f"backend: {backend}\n" + (
                    "instance_group: [{kind: cpu, count: 2}]\n" if backend in runtimes.RUNTIMES else "")
                if name == "convs":  # one thread a run: the GIL test's other thread has a core of its own
                    config += ("warmup: [{dims: {x: [3, 96, 96]}}]\nruntime: {cpu_threads: 1}\n"
                               "inference: {cpu_threads: 1}\n")
                (root / f"{name}-{backend}" / "config.yaml").write_text(config)
    return root


def two_inputs(rows: int, length: int) -> dict[str, np.ndarray]:
    return {"features": RNG.random((rows, 8), dtype=np.float32),
            "ids": RNG.integers(0, 50, (rows, length)).astype(np.int64)}


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_each_runtime_answers_as_the_predictor_with_two_inputs_of_two_datatypes(repository, backend):
    predictor = replica_of(repository, "two-inference", "cpu")
    replica = replica_of(repository, f"two-{backend}", "cpu")
    assert replica.backend == backend and replica.runtime_run is not None
    assert replica.predictor is None and replica.network is None  # the control: the Predictor's has one
    assert predictor.predictor is not None and predictor.runtime_run is None
    for rows, length in ((1, 1), (4, 7), (3, 30)):  # the sequence length changes between calls
        inputs = two_inputs(rows, length)
        want, _ = run(predictor, inputs)
        got, places = run(replica, inputs)
        assert list(got) == list(want) == ["fetch_name_0", "fetch_name_1"]
        np.testing.assert_allclose(got["fetch_name_0"], want["fetch_name_0"], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got["fetch_name_1"], want["fetch_name_1"])
        assert got["fetch_name_1"].dtype == np.int64 and places["output"] == {"cpu"}


def test_the_conversion_is_kept_by_the_exports_content(repository, onnx_cache, tmp_path):
    first = runtimes.onnx_file(repository / "two-onnxruntime" / "1" / "model")
    written = first.stat().st_mtime_ns
    assert first.is_relative_to(onnx_cache) and first.name == "model.onnx"
    # Another directory with the same bytes: the same file, not converted again.
    assert runtimes.onnx_file(repository / "two-auto" / "1" / "model") == first
    assert first.stat().st_mtime_ns == written
    # Other weights: another file (the control).
    paddle.seed(1)
    with PlaceEnv("cpu"):
        layer = TwoKinds()
        paddle.jit.save(layer, str(tmp_path / "model"), input_spec=TWO_KINDS_SPEC)
    other = runtimes.onnx_file(tmp_path / "model")
    assert other != first and other.is_file()


def test_a_conversion_that_fails_is_a_reason_kept_and_auto_serves_on(repository, onnx_cache):
    prefix = repository / "histogram-onnxruntime" / "1" / "model"
    with pytest.raises(runtimes.ConversionFailed, match="unsupported operators") as failed:
        runtimes.onnx_file(prefix)
    kept = list(onnx_cache.glob("*/failed.txt"))
    assert [p.read_text() for p in kept] == [str(failed.value)]
    with pytest.raises(runtimes.ConversionFailed) as again:  # from the cache: no second conversion
        runtimes.onnx_file(prefix)
    assert str(again.value) == str(failed.value) and list(onnx_cache.glob("*/failed.txt")) == kept
    # Asked for, the runtime is refused before the version is ready; under auto it is passed over.
    for backend in ("onnxruntime", "openvino"):
        with pytest.raises(RuntimeError, match=f"backend {backend}: paddle2onnx .* unsupported operators"):
            replica_of(repository, f"histogram-{backend}", "cpu")
    replica = replica_of(repository, "histogram-auto", "cpu")
    assert replica.choice["serves"] == "inference" and replica.predictor is not None
    assert set(replica.choice["passed_over"]) == {"onnxruntime", "openvino"}
    assert all("unsupported operators" in why for why in replica.choice["passed_over"].values())


def test_a_runtime_asked_for_where_it_has_no_provider_is_refused_before_ready(repository):
    for backend in ("onnxruntime", "openvino"):
        with pytest.raises(RuntimeError, match=f"backend {backend} cannot run on sim:0"):
            replica_of(repository, f"two-{backend}", "sim:0")
    assert replica_of(repository, "two-auto", "sim:0").backend == "jit"  # auto measures nothing there


def test_auto_serves_the_fastest_backend_whose_outputs_agree(repository):
    replica = replica_of(repository, "two-auto", "cpu")
    found = replica.choice
    assert set(found["timings_ms"]) == {"inference", "onnxruntime", "openvino"} and not found["passed_over"]
    assert found["serves"] == min(found["timings_ms"], key=found["timings_ms"].get)
    assert found["timings_ms"][found["serves"]] <= found["timings_ms"]["inference"]
    assert replica.backend.startswith(f"{found['serves']} (backend auto, measured: ")
    predictor = replica_of(repository, "two-inference", "cpu")
    inputs = two_inputs(3, 5)
    want, _ = run(predictor, inputs)
    got, _ = run(replica, inputs)
    np.testing.assert_allclose(got["fetch_name_0"], want["fetch_name_0"], rtol=1e-5, atol=1e-5)


def spoil(path) -> None:
    """The converted model made wrong: every floating-point weight doubled."""
    model = onnx.load(str(path))
    # paddle2onnx writes the weights as Constant nodes' values (initializers where an optimiser folds them).
    tensors = list(model.graph.initializer) + [attribute.t for node in model.graph.node if node.op_type == "Constant"
                                               for attribute in node.attribute if attribute.name == "value"]
    spoiled = 0
    for tensor in tensors:
        array = numpy_helper.to_array(tensor)
        if np.issubdtype(array.dtype, np.floating) and array.size > 1:
            tensor.CopyFrom(numpy_helper.from_array(array * 2, tensor.name))
            spoiled += 1
    assert spoiled, "no weights found to spoil"
    onnx.save(model, str(path))


def test_negative_control_auto_passes_over_a_converted_model_whose_answers_differ(repository, tmp_path):
    # Its own export (other weights), so that spoiling its conversion leaves the other tests' alone.
    shutil.copytree(repository / "convs-auto", tmp_path / "convs-auto")
    paddle.seed(7)
    with PlaceEnv("cpu"):
        paddle.jit.save(Convs(), str(tmp_path / "convs-auto" / "1" / "model"),
                        input_spec=[paddle.static.InputSpec([None, 3, -1, -1], "float32", "x")])
    spoil(runtimes.onnx_file(tmp_path / "convs-auto" / "1" / "model"))
    replica = replica_of(tmp_path, "convs-auto", "cpu")
    found = replica.choice
    assert found["serves"] == "inference" and replica.predictor is not None, found
    assert set(found["passed_over"]) == {"onnxruntime", "openvino"}
    assert all("differs from inference's by up to" in why for why in found["passed_over"].values()), found
    assert set(found["timings_ms"]) == {"inference"}
    # With tolerances no output can miss, the same spoiled model is taken: the check is what stopped it.
    (tmp_path / "convs-auto" / "config.yaml").write_text(
        "backend: auto\nchoice: {rtol: 1.0, atol: 1000.0}\nwarmup: [{dims: {x: [3, 96, 96]}}]\n")
    loose = replica_of(tmp_path, "convs-auto", "cpu").choice
    assert not loose["passed_over"] and set(loose["timings_ms"]) == {"inference", "onnxruntime", "openvino"}


@pytest.mark.parametrize("onednn", [True, False])
def test_auto_times_each_backend_on_random_inputs_of_every_shape_after_a_first_run_of_each_where_that_builds(
        repository, tmp_path, monkeypatch, onednn):
    # Its own export (other weights): a choice kept for the module's would be taken without a run.
    shutil.copytree(repository / "convs-auto", tmp_path / "convs-auto")
    config = tmp_path / "convs-auto" / "config.yaml"
    config.write_text(config.read_text().replace("inference: {cpu_threads: 1}",
                                                 f"inference: {{cpu_threads: 1, onednn: {str(onednn).lower()}}}"))
    paddle.seed(11)
    with PlaceEnv("cpu"):
        paddle.jit.save(Convs(), str(tmp_path / "convs-auto" / "1" / "model"),
                        input_spec=[paddle.static.InputSpec([None, 3, -1, -1], "float32", "x")])
    seen: dict[str, list[tuple[tuple[int, ...], bool]]] = {}

    def recorded(name, run):
        def each(arrays):
            seen.setdefault(name, []).append((arrays[0].shape, not arrays[0].any()))
            return run(arrays)

        return each

    runner, predictor_call = runtimes.Session.runner, choice._predictor_call
    monkeypatch.setattr(runtimes.Session, "runner", lambda session: recorded(session.runtime, runner(session)))
    monkeypatch.setattr(choice, "_predictor_call", lambda predictor: recorded("inference", predictor_call(predictor)))
    found = replica_of(tmp_path, "convs-auto", "cpu", max_batch_size=8).choice
    assert set(found["timings_ms"]) == {"inference", "onnxruntime", "openvino"} and not found["passed_over"], found
    shapes = [(1, 3, 96, 96), (8, 3, 96, 96)]  # the warm-up input, and it repeated to the batch served
    warm_then_random = [(shape, True) for shape in shapes] + [(shape, False) for shape in shapes]
    # OpenVINO, and a Predictor with oneDNN, build at a first run of a shape: the warm-up inputs first.
    assert seen["openvino"][:4] == warm_then_random
    # ONNX Runtime without its memory patterns, and a Predictor without oneDNN, build nothing a next run of
    # the shape reuses: random inputs at once, compared and timed.
    # (The version's own warm-up, through whichever serves, comes after the measurement's runs.)
    assert seen["onnxruntime"][:2] == [(shape, False) for shape in shapes]
    assert seen["inference"][:4 if onednn else 2] == (warm_then_random if onednn else warm_then_random[2:])


def test_auto_times_no_more_rounds_of_a_hopeless_backend_or_where_one_alone_is_left():
    calls: dict[str, int] = {}

    def timed(name):
        def run(arrays):
            calls[name] = calls.get(name, 0) + 1
            return arrays
        return run

    inputs = [[np.zeros(2, np.float32)]]
    found = choice._timed({n: timed(n) for n in "abc"}, inputs, 3, {"a": 10.0, "b": 15.0, "c": 21.0})
    assert calls == {"a": 2, "b": 2} and found["c"] == 21.0  # c: more than HOPELESS times a's
    calls.clear()
    found = choice._timed({n: timed(n) for n in "ab"}, inputs, 3, {"a": 10.0, "b": 21.0})
    assert calls == {} and found == {"a": 10.0, "b": 21.0}  # a alone is left: nothing to choose
    calls.clear()
    choice._timed({n: timed(n) for n in "ab"}, inputs, 3, {"a": 10.0, "b": 20.0})  # the control: both in
    assert calls == {"a": 2, "b": 2}


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_devices_workers_share_one_session_and_their_runs_leave_the_gil(repository, backend):
    entries, errors = scan([repository], [f"convs-{backend}", "convs-inference"], max_batch_size=4,
                           max_batch_delay_ms=0)
    assert not errors, errors
    first, second = device_workers(entries[f"convs-{backend}"])
    assert first.shares_weights and second.shares_weights
    assert first.context.share.session is second.context.share.session is not None
    x = RNG.standard_normal((2, 3, 160, 160)).astype(np.float32)
    hammer([first, second], [{"x": x}] * 6)
    # Other threads run through a runtime's run; the negative control: the binding's Predictor run holds the GIL.
    predictor = entries["convs-inference"].default
    config = paddle.inference.Config(str(predictor.program.with_suffix(".json")),
                                     str(predictor.program.with_suffix(".pdiparams")))
    config.set_cpu_math_library_num_threads(1)
    binding = paddle.inference.create_predictor(config)
    big = RNG.standard_normal((1, 3, 256, 256)).astype(np.float32)
    tensor = host_tensor(big)
    binding.run([tensor])
    runner = first.context.share.session.runner()
    free, held = [], []
    for _ in range(5):  # interleaved: a busy machine slows both alike
        stall, seconds = longest_stall(lambda: runner([big]))
        free.append(stall / seconds)
        stall, seconds = longest_stall(lambda: binding.run([tensor]))
        held.append(stall / seconds)
    # Held, the thread waits for nearly all of the run (the rest: the scheduler's turns around its ends).
    assert statistics.median(held) > 0.6, (free, held)
    assert statistics.median(free) < 0.35, (free, held)


#: A fresh interpreter: eight threads make their first OpenVINO runs at once, on our session (``ours``) or on
#: the binding's compiled model (``bare``). A deadlocked thread holds the GIL: the process is stopped from
#: outside.
FIRST_RUNS = """
import sys, threading
import numpy as np
from onnx import TensorProto, helper

mode, path = sys.argv[1], sys.argv[2]
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
model.ir_version = 8
with open(path, "wb") as file:
    file.write(model.SerializeToString())
if mode == "ours":
    from pathlib import Path
    from placeenv.serve.models import runtimes
    session = runtimes.OpenVinoSession(Path(path), "cpu", runtimes.RuntimeOptions())
    def runner():
        return session.runner()
else:
    import openvino
    compiled = openvino.Core().compile_model(path, "CPU")
    def runner():
        request = compiled.create_infer_request()
        def run(arrays):
            request.infer(arrays, share_inputs=True)
            return [np.array(request.get_output_tensor(0).data)]
        return run
together, failures = threading.Barrier(8), []
def first_run():
    try:
        run = runner()
        together.wait()
        assert run([np.full((1, 4), -1.0, np.float32)])[0].tolist() == [[0.0] * 4]
    except BaseException as exc:
        failures.append(repr(exc))
threads = [threading.Thread(target=first_run) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(failures or "ok", flush=True)
"""


def _first_runs(mode: str, path, timeout: float) -> str:
    """What the process printed ("ok", or the threads' failures), or "hung" after ``timeout`` seconds."""
    try:
        done = subprocess.run([sys.executable, "-c", FIRST_RUNS, mode, str(path)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hung"
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_workers_first_openvino_runs_at_once_do_not_deadlock(tmp_path):
    # The negative control first: the binding's first runs from several threads at once deadlock (about
    # half of the processes on this machine when idle, fewer beside another test's load: once 16 in a row
    # finished; one that finishes takes about a second).
    bare = []
    while len(bare) < 48 and "hung" not in bare:
        bare.append(_first_runs("bare", tmp_path / "relu.onnx", timeout=10))
    assert "hung" in bare, bare
    ours = []
    while len(ours) < 8 and ours.count("ok") == len(ours):
        ours.append(_first_runs("ours", tmp_path / "relu.onnx", timeout=60))
    assert ours == ["ok"] * 8, ours


#: A fresh interpreter: OpenVINO's session of three convolutions over a 1024x1024 image (32 channels: 128 MiB a
#: buffer), its buffers given back or kept (``release``, ``keep``); the MiB the process holds after the run
#: beyond what it held after a small one, the heap's free memory trimmed.
HELD_AFTER_A_LARGE_RUN = """import ctypes, os, sys
import numpy as np
from pathlib import Path
from onnx import TensorProto, helper, numpy_helper
from placeenv.serve.models import runtimes

release, path = sys.argv[1] == "release", sys.argv[2]
rng = np.random.default_rng(0)
weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)
           for name, shape in (("w1", (32, 3, 3, 3)), ("w2", (32, 32, 3, 3)), ("w3", (1, 32, 3, 3)))]
nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["d"]),
         helper.make_node("Conv", ["d", "w3"], ["y"], pads=[1, 1, 1, 1])]
graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])], weights)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
model.ir_version = 8
Path(path).write_bytes(model.SerializeToString())
session = runtimes.OpenVinoSession(Path(path), "cpu", runtimes.RuntimeOptions(release_buffers=release))
run = session.runner()
libc = ctypes.CDLL(None)

def resident() -> int:
    libc.malloc_trim(0)  # what the heap holds free is not what the session holds
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') >> 20

run([np.ones((1, 3, 64, 64), np.float32)])
before = resident()
assert run([np.ones((1, 3, 1024, 1024), np.float32)])[0].shape == (1, 1, 1024, 1024)
print("held", resident() - before)
"""


def test_openvino_gives_its_buffers_back_when_no_run_is_in_flight(tmp_path):
    held = {}
    for mode in ("release", "keep"):
        done = subprocess.run([sys.executable, "-c", HELD_AFTER_A_LARGE_RUN, mode, str(tmp_path / "convs.onnx")],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
        held[mode] = int(done.stdout.split()[-1])
    # The control: kept, the run's two 128 MiB buffers stay.
    assert held["release"] < 100 < 200 < held["keep"], held


def test_the_service_says_which_backend_serves_its_timings_and_why_the_others_were_passed_over(repository):
    with ServiceProcess(DEVICES="cpu,sim:0", WORKERS_PER_DEVICE=2, MODEL_REPOSITORY=str(repository),
                        MODELS="two-auto,two-onnxruntime,histogram-auto") as proc:
        configs = {name: httpx.get(f"{proc.url}/v2/models/{name}/config", timeout=10).json()
                   for name in ("two-auto", "two-onnxruntime", "histogram-auto")}
        metadata = {name: httpx.get(f"{proc.url}/v2/models/{name}", timeout=10).json()
                    for name in ("two-auto", "two-onnxruntime")}
        stats = httpx.get(f"{proc.url}/v2/models/two-auto/stats", timeout=10).json()["model_stats"]
        inputs = two_inputs(2, 4)
        body = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32" if a.dtype == np.float32
                            else "INT64", "data": a.ravel().tolist()} for n, a in inputs.items()]}
        answer = httpx.post(f"{proc.url}/v2/models/two-onnxruntime/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    parameters = {n: c["parameters"] for n, c in configs.items()}
    choice = json.loads(parameters["two-auto"]["backend_choice"]["string_value"])
    assert set(choice) == {"cpu"}  # sim:0 runs jit.load, measuring nothing
    assert choice["cpu"]["serves"] == min(choice["cpu"]["timings_ms"], key=choice["cpu"]["timings_ms"].get)
    backends = json.loads(parameters["two-auto"]["backends"]["string_value"])
    assert backends["sim:0"] == "jit" and backends["cpu"].startswith(choice["cpu"]["serves"] + " (backend auto")
    assert stats[0]["backends"] == backends
    assert json.loads(parameters["two-onnxruntime"]["backends"]["string_value"]) == {"cpu": "onnxruntime"}
    passed = json.loads(parameters["histogram-auto"]["backend_choice"]["string_value"])["cpu"]["passed_over"]
    assert set(passed) == {"onnxruntime", "openvino"}
    assert metadata["two-onnxruntime"]["platform"] == "onnxruntime_onnx"


def test_a_choice_is_kept_for_the_next_start_and_measured_again_when_what_it_depends_on_changes(repository, tmp_path):
    shutil.copytree(repository / "two-auto", tmp_path / "two-auto")
    paddle.seed(11)  # an export of its own: no test measured it before
    with PlaceEnv("cpu"):
        paddle.jit.save(TwoKinds(), str(tmp_path / "two-auto" / "1" / "model"), input_spec=TWO_KINDS_SPEC)
    first = replica_of(tmp_path, "two-auto", "cpu").choice
    again = replica_of(tmp_path, "two-auto", "cpu").choice
    assert not first["cached"] and again["cached"]
    assert {k: v for k, v in again.items() if k != "cached"} == {k: v for k, v in first.items() if k != "cached"}
    # The control: other options are another measurement.
    (tmp_path / "two-auto" / "config.yaml").write_text("backend: auto\nchoice: {rounds: 2}\n")
    other = replica_of(tmp_path, "two-auto", "cpu").choice
    assert not other["cached"] and other["measured_at"] >= first["measured_at"]


class Overlaps(runtimes.Session):
    """A session whose run waits, up to a deadline, for another worker's run to have started too: the runs
    inside it at once, at most (the gate's own logic, on any runtime)."""

    def __init__(self, options: runtimes.RuntimeOptions) -> None:
        super().__init__(options)
        self.inside, self.entered, self.most, self.lock = 0, 0, 0, threading.Lock()

    def _run_call(self):
        def run(arrays):
            with self.lock:
                self.inside, self.entered = self.inside + 1, self.entered + 1
                self.most = max(self.most, self.inside)
            # Until both have entered, or the other is counted and held back by the gate.
            wait_until(lambda: self.entered == 2 or (self._running == 2 and arrays[0].nbytes > self._large), 60,
                       "the other run did not start")
            with self.lock:
                self.inside -= 1
            return arrays

        return run


@pytest.mark.parametrize("mib, overlap", [(1, 1), (4, 2)])
def test_runs_on_inputs_over_large_input_mib_take_turns(mib, overlap):
    # 2 MiB inputs: over a 1 MiB limit they take turns; under the default 4 MiB (the control) they overlap.
    session = Overlaps(runtimes.RuntimeOptions(large_input_mib=mib))
    arrays = [np.zeros(1 << 19, np.float32)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(session.runner(), arrays) for _ in range(2)]:
            assert done.result(timeout=120) is arrays
    assert session.most == overlap and session._running == 0


def _dynamic_relu(path) -> None:
    """An ONNX model of one input with its batch and width left open, and two outputs (relu, neg)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "w"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n", 3, "w"]) for name in ("y", "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def test_a_workers_openvino_request_keeps_no_input_after_its_run(tmp_path):
    import weakref

    _dynamic_relu(tmp_path / "relu.onnx")
    session = runtimes.OpenVinoSession(tmp_path / "relu.onnx", "cpu", runtimes.RuntimeOptions())
    run = session.runner()
    page = np.random.default_rng(0).standard_normal((2, 3, 1 << 18)).astype(np.float32)
    y, z = run([page])
    assert np.array_equal(y, np.maximum(page, 0)) and np.array_equal(z, -page)  # the outputs in the model's order
    # A float64 page, not contiguous: the run converts it; the answers stay.
    wide = page.astype(np.float64)[:, :, ::2]
    assert np.array_equal(run([wide])[0], np.maximum(page[:, :, ::2], 0))
    gone = weakref.ref(page)
    del page, wide
    assert gone() is None  # the worker's request holds no page between runs
    assert run([np.ones((1, 3, 5), np.float32)])[1].tolist() == [[[-1.0] * 5] * 3]  # and runs the next

    # The control: OpenVINO's own request, given the page to share, holds it until its next run.
    request = session.compiled.create_infer_request()
    page = np.ones((2, 3, 1 << 18), np.float32)
    request.infer([page], share_inputs=True)
    held = weakref.ref(page)
    del page
    assert held() is not None
    request.infer([np.ones((1, 3, 5), np.float32)], share_inputs=True)
    assert held() is None


#: A service process's settings from its environment, set up as it sets them up at start; then the threads a
#: CPU run takes where its model names none.
DEFAULT_THREADS = """from placeenv.serve.config import Settings
from placeenv.serve.models import runtimes
Settings().set_up_process()
print(runtimes.default_threads())
"""


def test_the_services_cpu_threads_is_every_runtimes_default(tmp_path, monkeypatch):
    """PLACEENV_CPU_THREADS: each process of the service takes it at start, and it is the threads of ONNX
    Runtime's and OpenVINO's runs and of a Predictor's math library (the config ``inference.create`` builds
    it from) whose model's options name none; a model's own wins. The control: unset, every core this
    process may use."""
    cores = len(os.sched_getaffinity(0))
    # Counts other than the control's, on a machine of one core too; OpenVINO takes at most the cores.
    others, own = (1, 2) if cores > 1 else (2, 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}
    for given, expected in ((None, cores), (others, others)):
        env.pop("PLACEENV_CPU_THREADS", None)
        if given is not None:
            env["PLACEENV_CPU_THREADS"] = str(given)
        found = subprocess.run([sys.executable, "-c", DEFAULT_THREADS], env=env, capture_output=True, text=True,
                               timeout=120)
        assert found.returncode == 0, found.stderr[-2000:]
        assert int(found.stdout.split()[-1]) == expected, (given, found.stdout)

    _dynamic_relu(tmp_path / "relu.onnx")
    paddle.jit.save(paddle.nn.Linear(2, 2), str(tmp_path / "model"),
                    input_spec=[paddle.static.InputSpec([None, 2], "float32")])

    def threads(cpu_threads: int | None = None) -> tuple[int, int, int]:
        options = runtimes.RuntimeOptions(cpu_threads=cpu_threads)
        ort = runtimes.OnnxRuntimeSession(tmp_path / "relu.onnx", "cpu", options)
        openvino = runtimes.OpenVinoSession(tmp_path / "relu.onnx", "cpu", options)
        predictor = inference.predictor_config(tmp_path / "model", paddle.CPUPlace(),
                                               inference.InferenceOptions(cpu_threads=cpu_threads))
        return (ort.session.get_session_options().intra_op_num_threads,
                int(openvino.compiled.get_property("INFERENCE_NUM_THREADS")), predictor.cpu_math_library_num_threads())

    monkeypatch.delenv("PLACEENV_CPU_THREADS", raising=False)
    assert threads() == (cores, cores, cores)  # the control
    monkeypatch.setenv("PLACEENV_CPU_THREADS", str(others))  # as set_up_process sets it
    assert threads() == (others, min(others, cores), others)
    assert threads(own) == (own, min(own, cores), own)  # the model's own
