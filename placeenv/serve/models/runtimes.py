"""ONNX Runtime and OpenVINO as backends of a Paddle export, beside Paddle Inference and ``paddle.jit.load``.

The export (``inference.json`` / ``model.json`` and its ``.pdiparams``) is converted to ONNX by
``paddle2onnx``, Paddle's own converter, once: the file is kept in the user cache under the digest of the
export's bytes and the converter's version, where the sim plugin and the native shim are kept
(``PLACEENV_ONNX_CACHE`` names another directory). The converter runs in a child process: it imports Paddle
afresh and switches its static mode, and a crash of it is a reason, never the service's end. A conversion
that fails is kept as its reason under the same digest, so the next start does not try again.

A session is made once per version and device and shared by the device's workers: ONNX Runtime's
``InferenceSession.run`` is safe from several threads and leaves the GIL while it runs, so their runs
overlap with one copy of the weights. OpenVINO's compiled model is shared the same way, each worker with an
infer request of its own (a request is one run at a time); its ``infer`` leaves the GIL too.

Devices: ONNX Runtime runs on the CPU, and on ``gpu:N`` through its CUDA execution provider with
``device_id`` N where the installed package has it (onnxruntime-gpu); OpenVINO on the CPU only (its GPU
plugin is Intel's, not CUDA). Elsewhere (custom devices, sim) neither is offered.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from placeenv.cbuild import cache_root
from placeenv.serve.config import CPU_THREADS, trim_freed_memory

Runtime = Literal["onnxruntime", "openvino"]
RUNTIMES: tuple[Runtime, ...] = ("onnxruntime", "openvino")
#: The ONNX opset the export is converted to: paddle2onnx's tested one for PP-OCR and PaddleX's exports.
OPSET = 14
#: A conversion that hangs holds up every worker's start: it fails instead.
CONVERT_TIMEOUT_S = 600


class RuntimeOptions(BaseModel):
    """What users tune of ONNX Runtime and OpenVINO on the CPU."""

    model_config = ConfigDict(extra="forbid")
    cpu_threads: int | None = Field(
        None, ge=1, le=1024, description="threads a run uses on the CPU; default: the service's cpu_threads, "
        "else every core this process may use (a run alone takes them all; the device's workers' runs overlap "
        "and share them)")
    memory_arena: bool = Field(
        False, description="ONNX Runtime's CPU memory arena: off, each run's buffers go back to the system, "
        "so resident memory does not grow with every new input shape; on, it keeps them for the next run")
    shape_cache: int = Field(
        16, ge=0, le=100000, description="OpenVINO's kernels kept per input shape (CPU_RUNTIME_CACHE_CAPACITY; "
        "its own default 5000): a page of every new size adds to it, and its memory with it")
    large_input_mib: int = Field(
        4, ge=0, le=1 << 20, description="runs of the device's session whose inputs are larger (MiB) take "
        "turns: each holds hundreds of MiB of buffers while it runs (PP-OCRv5's detector on a large page), "
        "and side by side they would hold them at once, for little speed where each takes every "
        "core; 0: no turns, and release_buffers gives back after every run")
    release_buffers: bool = Field(
        True, description="OpenVINO gives its intermediate buffers back when no run of the session is in "
        "flight after one over large_input_mib (CompiledModel.release_memory): else it keeps those of the "
        "largest input it ran (docs/benchmarks.md). Smaller runs keep "
        "theirs: allocated again, each run would fault its pages in anew")


class ConversionFailed(RuntimeError):
    """paddle2onnx could not convert the export: the reason, said once."""


def unavailable(runtime: Runtime, device: str) -> str | None:
    """Why ``runtime`` is not offered on ``device`` (its package is missing, or it has no provider there);
    None where it is."""
    kind, _, index = device.partition(":")
    if runtime == "onnxruntime":
        try:
            import onnxruntime
        except ImportError as exc:
            return f"onnxruntime is not installed ({exc})"
        if kind == "cpu":
            return None
        if kind == "gpu":
            if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
                return None
            return (f"the installed onnxruntime has no CUDA execution provider for {device} "
                    "(install onnxruntime-gpu)")
        return f"ONNX Runtime has no execution provider for {device}"
    try:
        import openvino  # noqa: F401
    except ImportError as exc:
        return f"openvino is not installed ({exc})"
    if kind == "cpu":
        return None
    return f"OpenVINO runs on the CPU here; its GPU plugin is Intel's, and {device} is not one it has"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


_convert_locks: dict[Path, threading.Lock] = {}
_convert_locks_lock = threading.Lock()


def export_digest(program: Path) -> str:
    """The digest of the saved program at ``program`` (its path prefix): its files' bytes and the converter's
    version, what its conversion is kept under. Each version of the files (size and modification time) is
    read once: a start asks for it at each conversion, session and measurement."""
    parts = (program.with_suffix(".json"), program.with_suffix(".pdiparams"))
    stamps = tuple((stat.st_size, stat.st_mtime_ns) if (stat := _stat(part)) is not None else None
                   for part in parts)
    return _digest(parts, stamps)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


@functools.lru_cache(maxsize=256)
def _digest(parts: tuple[Path, ...], stamps: tuple) -> str:
    digest = hashlib.sha256()
    for part, stamp in zip(parts, stamps):
        digest.update(part.read_bytes() if stamp is not None else b"-")
    digest.update(f"paddle2onnx {_version('paddle2onnx')} opset {OPSET}".encode())
    return digest.hexdigest()[:16]


def onnx_file(program: Path) -> Path:
    """The ONNX file of the saved program at ``program`` (its path prefix), converted on first use and kept;
    ``ConversionFailed`` with paddle2onnx's reason where it cannot be."""
    graph = program.with_suffix(".json")
    params = program.with_suffix(".pdiparams")
    directory = cache_root("PLACEENV_ONNX_CACHE", "onnx") / export_digest(program)
    found, failed = directory / "model.onnx", directory / "failed.txt"
    with _convert_locks_lock:
        lock = _convert_locks.setdefault(directory, threading.Lock())
    with lock:  # the workers of several devices find it missing at once: one converts (other exports meanwhile)
        if found.is_file():
            return found
        if failed.is_file():
            raise ConversionFailed(failed.read_text(encoding="utf-8"))
        directory.mkdir(parents=True, exist_ok=True)
        # Written beside the target and renamed: another process never reads half a file.
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            partial = Path(tmp) / "model.onnx"
            problem = _convert(graph, params, partial)
            if problem is None:
                os.replace(partial, found)
                return found
            (Path(tmp) / "failed.txt").write_text(problem, encoding="utf-8")
            os.replace(Path(tmp) / "failed.txt", failed)
        raise ConversionFailed(problem)


_converting = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="paddle2onnx")


def convert_soon(programs: list[Path], device: str) -> None:
    """Start converting ``programs`` in the background where a runtime is offered on ``device``: a worker's
    first model then measures while the next ones' child processes convert (``onnx_file`` waits for one
    under way). A failure is kept as ``onnx_file`` keeps it."""
    if all(unavailable(runtime, device) is not None for runtime in RUNTIMES):
        return
    for program in programs:
        _converting.submit(_quietly, program)


def _quietly(program: Path) -> None:
    try:
        onnx_file(program)
    except Exception:  # noqa: BLE001 - kept, and said where a backend asks for it
        pass


def _convert(graph: Path, params: Path, target: Path) -> str | None:
    """Run paddle2onnx in a child process; None on success, else why not."""
    if _version("paddle2onnx") == "none":
        return "paddle2onnx is not installed"
    # onnxoptimizer, not paddle2onnx's default polygraphy, which sets POLYGRAPHY_AUTOINSTALL_DEPS and may
    # run pip inside the service.
    code = ("import sys, paddle2onnx; paddle2onnx.export(sys.argv[1], sys.argv[2], sys.argv[3], "
            f"opset_version={OPSET}, optimize_tool='onnxoptimizer', verbose=False)")
    try:
        result = subprocess.run([sys.executable, "-c", code, str(graph), str(params) if params.is_file() else "",
                                 str(target)], capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S,
                                env={**os.environ, "GLOG_minloglevel": "2"})
    except subprocess.TimeoutExpired:
        return f"paddle2onnx did not finish within {CONVERT_TIMEOUT_S} s"
    if result.returncode == 0 and target.is_file():
        return None
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in (result.stdout + result.stderr).splitlines()]
    # Its own words first ("[ERROR][Paddle2ONNX] Due to the unsupported operators, ..."), then Python's; the
    # abort that follows them says nothing.
    said = next((line for line in lines if "[ERROR]" in line), None) or next(
        (line for line in reversed(lines) if "Error" in line and "FatalError" not in line), None) or (
        f"it exited with status {result.returncode}")
    return f"paddle2onnx {_version('paddle2onnx')} could not convert {graph.name}: {said[:300]}"


def default_threads() -> int:
    """Threads a CPU run uses where its model's options name none: the service's ``cpu_threads``, else every core
    this process may use (a run alone takes them all, and runs that overlap share them, which measured faster
    than a share of the cores each: docs/benchmarks.md, "Predictor runs without the GIL")."""
    given = os.environ.get(CPU_THREADS)  # (set by config.Settings.set_up_process, which validates it)
    if given:
        return int(given)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Session:
    """One backend's compiled model of a version on a device, shared by the device's workers; ``runner()``
    gives a worker the call that runs it: host arrays in the program's input order, host arrays in its
    output order. Runs on inputs larger than the options' ``large_input_mib`` take turns; ``idle()`` is
    called by the last run in flight as it ends, before any other starts, where a large one ran since."""

    runtime: Runtime
    input_names: list[str]

    def __init__(self, options: RuntimeOptions) -> None:
        self._large = options.large_input_mib << 20
        self._turns = threading.Lock()
        self._count_lock, self._running, self._large_ran = threading.Lock(), 0, False

    def runner(self):
        run, large, turns = self._run_call(), self._large, self._turns

        def counted(arrays: list[np.ndarray]) -> list[np.ndarray]:
            with self._count_lock:
                self._running += 1
            big = sum(a.nbytes for a in arrays) > large
            try:
                if big and large:
                    with turns:
                        return run(arrays)
                return run(arrays)
            finally:
                with self._count_lock:
                    self._running -= 1
                    self._large_ran = self._large_ran or big
                    quiet = not self._running and self._large_ran
                    if quiet:
                        self._large_ran = False
                        self.idle()
                if quiet:  # the whole process's heap: no run need wait for it
                    trim_freed_memory()

        return counted

    def _run_call(self):
        """A worker's own call of the runtime."""
        raise NotImplementedError

    def builds_per_shape(self) -> bool:
        """Whether a first run of an input shape builds what its next runs reuse (kernels, memory plans),
        so that it runs slower than they do: ``auto`` runs each shape once before it times one."""
        return True

    def idle(self) -> None:
        pass


class OnnxRuntimeSession(Session):
    runtime = "onnxruntime"

    def __init__(self, path: Path, device: str, options: RuntimeOptions) -> None:
        import onnxruntime

        super().__init__(options)
        settings = onnxruntime.SessionOptions()
        settings.intra_op_num_threads = options.cpu_threads or default_threads()
        settings.inter_op_num_threads = 1
        settings.enable_cpu_mem_arena = options.memory_arena
        settings.enable_mem_pattern = options.memory_arena  # its plans are per input shape
        settings.log_severity_level = 3
        # Its threads sleep between runs instead of spinning for the next: the device's other workers' runs
        # and the pipelines' CPU steps need the cores (two workers' runs of PP-OCRv5's detector: 4.8 runs/s
        # against 4.3 spinning).
        settings.add_session_config_entry("session.intra_op.allow_spinning", "0")
        kind, _, index = device.partition(":")
        providers: list[Any] = ["CPUExecutionProvider"]
        if kind == "gpu":
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(index or 0)}))
        self.session = onnxruntime.InferenceSession(str(path), settings, providers=providers)
        # Its memory patterns are planned at a first run of a shape, and the CUDA provider searches cuDNN's
        # convolution algorithms there; on the CPU without patterns a run keeps nothing for the next.
        self.first_run_builds = settings.enable_mem_pattern or kind == "gpu"
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def _run_call(self):
        session, inputs, outputs = self.session, self.input_names, self.output_names

        def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
            return session.run(outputs, dict(zip(inputs, arrays, strict=True)))

        return run

    def builds_per_shape(self) -> bool:
        return self.first_run_builds


class OpenVinoSession(Session):
    runtime = "openvino"

    def __init__(self, path: Path, device: str, options: RuntimeOptions) -> None:
        super().__init__(options)
        openvino = _openvino()
        core = openvino.Core()
        # f32: on a CPU with AMX it would run bf16, whose answers differ (0.16 on PP-OCRv5's recogniser's logits).
        config = {"INFERENCE_NUM_THREADS": options.cpu_threads or default_threads(),
                  "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                  "CPU_RUNTIME_CACHE_CAPACITY": options.shape_cache}
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        self.release = options.release_buffers

    def _run_call(self):
        openvino = _openvino()
        request = self.compiled.create_infer_request()  # one run at a time: one a worker
        ports = self.compiled.inputs
        dtypes = [port.get_element_type().to_dtype() for port in ports]
        # What the request holds between runs: a tensor of one element a dimension left open. It keeps the
        # tensors it ran on until its next run (and OpenVINO's wrapper, given arrays, keeps them too): a
        # worker's last page would stay in memory while the worker idles, one for each worker and session.
        placeholders = [openvino.Tensor(port.get_element_type(), openvino.Shape(
            [d.get_length() if d.is_static else 1 for d in port.get_partial_shape()])) for port in ports]

        def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
            arrays = [np.ascontiguousarray(a, dtype) for a, dtype in zip(arrays, dtypes, strict=True)]
            for i, array in enumerate(arrays):  # the run reads them in place; they outlive it here
                request.set_input_tensor(i, openvino.Tensor(array, shared_memory=True))
            try:
                return list(request.infer().to_tuple())  # the outputs copied once, in the model's order
            finally:
                for i, placeholder in enumerate(placeholders):
                    request.set_input_tensor(i, placeholder)

        return run

    def idle(self) -> None:
        if self.release:
            self.compiled.release_memory()


_openvino_lock = threading.Lock()
_openvino_module: Any = None


def _openvino():
    """``openvino``, its binding's first run from Python made in one thread. The binding makes its NumPy
    handles on first use under a C++ static guard and gives up the GIL inside: two workers' first runs at
    once deadlock, one holding the guard and waiting for the GIL, the other holding the GIL and waiting for
    the guard (a start of PP-OCRv5's det and rec that never became ready)."""
    global _openvino_module
    with _openvino_lock:
        if _openvino_module is None:
            import openvino
            from openvino import opset13

            x = opset13.parameter([1], np.float32)
            compiled = openvino.Core().compile_model(openvino.Model([opset13.relu(x)], [x]), "CPU")
            request = compiled.create_infer_request()
            request.infer([np.ones(1, np.float32)], share_inputs=True)
            np.array(request.get_output_tensor(0).data)
            _openvino_module = openvino
    return _openvino_module


def open_session(runtime: Runtime, program: Path, device: str, options: RuntimeOptions) -> Session:
    """``runtime``'s session of the saved program at ``program`` on ``device`` (converted first);
    ``ConversionFailed`` or the runtime's own error where it cannot be made."""
    path = onnx_file(program)
    kind = OnnxRuntimeSession if runtime == "onnxruntime" else OpenVinoSession
    return kind(path, device, options)
