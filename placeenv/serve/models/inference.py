"""Paddle Inference as a model's backend: a ``paddle.inference`` Predictor per worker, the way
Paddle's own deployment tools (PaddleX, FastDeploy, Triton's Paddle backend) run a saved program,
with its graph passes and oneDNN on the CPU (TensorRT on GPUs).

A model's ``backend`` (config file) is ``jit`` (``paddle.jit.load``), ``inference`` (a Predictor),
or ``auto``: a Predictor on the CPU, and on a GPU when it is the process's only accelerator;
``paddle.jit.load`` on custom devices, where Paddle Inference runs no faster, and on GPUs when the
process serves several. The binding's ``run`` holds the GIL while its device works, so the
Predictors of several GPUs would take turns, where ``paddle.jit.load``'s forward lets them
overlap (docs/models.md, "Backends"; docs/benchmarks.md, "Device time"); on the CPU, runs leave
the GIL (placeenv.native) and each worker runs a Predictor of its own. With ``auto``, a program
the Predictor cannot load falls back to ``paddle.jit.load``, said once in the log and in the
model's ``/v2/models/{m}/config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import paddle
from pydantic import BaseModel, ConfigDict, Field, model_validator

from placeenv import device_name
from placeenv.serve.models import runtimes

Backend = Literal["auto", "jit", "inference", "onnxruntime", "openvino"]


class ChoiceOptions(BaseModel):
    """How ``backend: auto`` measures (models/choice.py): how close a runtime's outputs must be to Paddle's
    before it may serve, and how many rounds of the warm-up inputs it is timed over."""

    model_config = ConfigDict(extra="forbid")
    rtol: float = Field(1e-3, ge=0, le=1, description="relative tolerance of every output, against Paddle's")
    atol: float = Field(1e-4, ge=0, le=1e3, description="absolute tolerance of every output, against Paddle's")
    rounds: int = Field(3, ge=1, le=50, description="interleaved rounds each backend is timed over (median)")
    backends: list[Literal["inference", "onnxruntime", "openvino"]] | None = Field(
        None, description="the backends auto measures; default: Paddle Inference and every runtime installed "
        "that has a provider for the device")


class ShapeRange(BaseModel):
    """One input's shapes for TensorRT's dynamic shapes: the smallest, the most common, the largest."""

    model_config = ConfigDict(extra="forbid")
    min: list[int]
    opt: list[int]
    max: list[int]

    @model_validator(mode="after")
    def _ordered(self) -> ShapeRange:
        if not len(self.min) == len(self.opt) == len(self.max) or any(
                not 0 < a <= b <= c for a, b, c in zip(self.min, self.opt, self.max)):
            raise ValueError("min, opt and max have the same rank, and 0 < min <= opt <= max in each dimension")
        return self


class TensorRTOptions(BaseModel):
    """TensorRT on a GPU (``Config.enable_tensorrt_engine``); untested here: no GPU wheel installs."""

    model_config = ConfigDict(extra="forbid")
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    workspace_mb: int = Field(1024, ge=1, le=1 << 20)
    min_subgraph_size: int = Field(3, ge=1)
    shapes: dict[str, ShapeRange] = Field(default_factory=dict, description="dynamic shapes, by input name")


class InferenceOptions(BaseModel):
    """What users tune of a Predictor (``paddle.inference.Config``)."""

    model_config = ConfigDict(extra="forbid")
    onednn: bool = Field(True, description="oneDNN kernels on the CPU")
    onednn_ops: Literal["all", "fused"] = Field(
        "all", description="with oneDNN on: every op oneDNN has a kernel for (all), or only the fused "
        "convolutions its passes make, Paddle's own kernels running the rest (fused). A Predictor that "
        "cannot run its program with all is rebuilt with fused before oneDNN is turned off")
    cpu_threads: int | None = Field(
        None, ge=1, le=1024, description="math-library threads a Predictor uses on the CPU; default: the "
        "service's cpu_threads, else every core (a run alone takes them all; runs that overlap share them)")
    ir_optim: bool = Field(True, description="Paddle Inference's graph optimisation passes")
    gpu_memory_mb: int = Field(256, ge=1, description="the initial memory pool on a GPU")
    tensorrt: TensorRTOptions | None = Field(None, description="on GPUs only")


_PRECISION = {"fp32": "Float32", "fp16": "Half", "int8": "Int8"}

#: The pass that moves each op oneDNN has a kernel for onto it; the fusion passes before it make their fused
#: convolutions oneDNN ops themselves. Without it, an op whose oneDNN kernel Paddle 3.3 cannot run (an
#: upsampling's scales, in PP-OCRv5's text detector: Paddle issue #79749) keeps Paddle's own kernel.
ONEDNN_PLACEMENT_PASS = "onednn_placement_pass"


def chosen(backend: Backend, device: str, accelerators: int = 1) -> Literal["jit", "inference"]:
    """The backend a worker on ``device`` runs in a process that serves ``accelerators`` accelerators:
    ``auto`` takes a Predictor on the CPU, and on a GPU only where it is the process's one accelerator
    (the workers of a device share one Predictor and take turns on it)."""
    if backend != "auto":
        return backend
    if device == "cpu" or (device.startswith("gpu:") and accelerators <= 1):
        return "inference"
    return "jit"


def why_jit(device: str, accelerators: int) -> str | None:
    """Why ``auto`` runs ``paddle.jit.load`` on ``device``, where that is not the plain rule."""
    if device.startswith("gpu:") and accelerators > 1:
        return (f"jit (backend auto: this process serves {accelerators} accelerators, and a Predictor holds "
                "the GIL while its device works, so theirs would take turns)")
    return None


def create(program: Path, place, options: InferenceOptions) -> paddle.inference.Predictor:
    """A Predictor of the saved program at ``program`` (its path prefix) on ``place``."""
    return paddle.inference.create_predictor(predictor_config(program, place, options))


def predictor_config(program: Path, place, options: InferenceOptions) -> paddle.inference.Config:
    """The Paddle Inference config ``create`` builds its Predictor from."""
    json = program.with_suffix(".json")
    params = program.with_suffix(".pdiparams")
    config = paddle.inference.Config(str(json), str(params) if params.is_file() else "")
    config.disable_glog_info()  # its passes' log lines, per Predictor, per worker
    # Not enable_memory_optim(): with PIR programs (Paddle 3.3) the Predictor then fails to build
    # ("Not find predictor_id 0 and pass_name memory_optimize_pass").
    config.switch_ir_optim(options.ir_optim)
    device = device_name(place)
    kind, _, index = device.partition(":")
    if kind == "cpu":
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(options.cpu_threads or runtimes.default_threads())
        if options.onednn:
            config.enable_mkldnn()
            if options.onednn_ops == "fused":
                config.delete_pass(ONEDNN_PLACEMENT_PASS)
        else:
            config.disable_mkldnn()
    elif kind == "gpu":
        config.enable_use_gpu(options.gpu_memory_mb, int(index))
        trt = options.tensorrt
        if trt is not None:
            config.enable_tensorrt_engine(
                workspace_size=trt.workspace_mb << 20, max_batch_size=1, min_subgraph_size=trt.min_subgraph_size,
                precision_mode=getattr(paddle.inference.PrecisionType, _PRECISION[trt.precision]),
                use_static=False, use_calib_mode=False)  # int8: a quantised program, not calibration
            if trt.shapes:
                config.set_trt_dynamic_shape_info({n: r.min for n, r in trt.shapes.items()},
                                                  {n: r.max for n, r in trt.shapes.items()},
                                                  {n: r.opt for n, r in trt.shapes.items()})
    else:
        config.enable_custom_device(kind, int(index or 0))
    return config
