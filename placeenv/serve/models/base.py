"""The model contract, like Triton's python backend: ``initialize / preprocess / execute / postprocess / finalize``.

A repository entry is served by one ``Model`` per worker thread (a replica), bound to
that worker's device by ``initialize(place)``. The replicas on one device share one copy of
each version's weights (``DeviceShare``). A request's typed tensors pass through

    preprocess(inputs)   host numpy arrays in, host arrays out; CPU, any thread, under PlaceEnv('cpu')
    -> batched along the first dimension and moved to the worker's device
    execute(inputs)      device tensors in, tensors out; the worker thread, under PlaceEnv(place)
                         (host arrays in, arrays or tensors out, where the model sets ``takes_arrays``)
    postprocess(outputs) tensors in, host numpy arrays out; the worker thread

and ``finalize()`` runs when the worker stops. Every method has a default, so a bare
``paddle.jit.save`` directory needs no code: ``initialize`` loads the saved program (a Paddle
Inference Predictor or ``paddle.jit.load``, as the config's ``backend`` says) and ``execute``
runs it. A ``model.py`` overrides what it needs.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import paddle

import placeenv
from placeenv import PlaceEnv, device_name
from placeenv.tensors import JIT_LOAD_LOCK, host_tensor, host_view, move_to

from ..protocol.request import NO_PARAMETERS, InputError, TensorSpec
from . import backends
from .backends import DeviceShare, host_array
from .inference import Backend, ChoiceOptions, InferenceOptions
from .runtimes import RuntimeOptions

__all__ = ["InputError", "Model", "ModelContext", "TensorSpec", "batch_tensor", "host_tensor", "move_to"]


class ModelError(RuntimeError):
    """A model broke its contract (the request's failure, not the client's)."""


class Serving:
    """What a model's code reads of the request it serves: its parameters (``Model.request_parameters``),
    and in a batch's forward pass what ``Model.infer`` needs: the engine's way in for a call (under the
    generation the batch's requests were admitted under), the event loop they came from, their strictest
    deadline, the models they are inside of (a call to one of them is a cycle), and the worker's calls
    (``engine/calls.py``: it serves its own queue while it waits), with its thread's identity.

    The engine sets it by a token pair (``SERVING.set`` and ``reset``) around a
    request's preprocess and a batch's forward, as ``PlaceEnv`` sets a device: a batch served meanwhile
    sets its own and leaves this one as it was. Read-only by convention: nothing changes one once set."""

    __slots__ = ("parameters", "call", "loop", "deadline", "chain", "worker", "thread")

    def __init__(self, parameters: dict[str, Any] | None = None, call: Callable | None = None, loop: Any = None,
                 deadline: float = 0.0, chain: tuple[str, ...] = (), worker: Any = None, thread: int = 0) -> None:
        # Made for every batch: a plain class (a frozen dataclass's __init__ sets each field by a call).
        self.parameters = parameters  # None: the request sent none
        self.call = call  # None: no call can be made here (a preprocess)
        self.loop, self.deadline, self.chain, self.worker = loop, deadline, chain, worker
        self.thread = thread  # the worker thread's ``threading.get_ident()``: a call from another is refused


NOT_SERVING = Serving()
SERVING: contextvars.ContextVar[Serving] = contextvars.ContextVar("placeenv_serving", default=NOT_SERVING)


@dataclasses.dataclass(frozen=True)
class ModelContext:
    """What ``initialize`` gets besides the place: where the version's files are, and the entry's specs."""

    name: str
    version: int
    directory: Path  # the version directory: <repository>/<model>/<version>
    program: Path | None  # the saved program's path prefix (<directory>/model or .../inference), if any
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: Mapping[str, Any]  # the config file's free-form ``parameters``
    backend: Backend = "jit"  # the config file's: what runs the saved program (models/inference.py)
    inference: InferenceOptions = dataclasses.field(default_factory=InferenceOptions)
    runtime: RuntimeOptions = dataclasses.field(default_factory=RuntimeOptions)
    choice: ChoiceOptions = dataclasses.field(default_factory=ChoiceOptions)
    # The accelerators this process serves: ``auto`` runs a Predictor on a GPU only when it is 1, since a
    # Predictor holds the GIL while its device works.
    accelerators: int = 1
    share: DeviceShare | None = None  # this version's weights on this device; None: a copy of its own
    # The config's: None shares a replica's weights only where the defaults load them (a model.py's own
    # load() or initialize() may make or change tensors per replica); True and False say so for it.
    share_weights: bool | None = None
    # The config's batch_padding: input -> (the dims its batch's parts are padded in, the value they hold).
    padding: Mapping[str, tuple[tuple[int, ...], float]] = dataclasses.field(default_factory=dict)
    # The version's warm-up requests' arrays, as clients send them: what backend auto measures on.
    samples: tuple[Mapping[str, np.ndarray], ...] = ()
    max_batch_size: int = 0  # the entry's: auto also times its samples at the batch it serves


class Model:
    """One replica of a repository entry. Subclass it in ``model.py`` as ``class Model(placeenv.serve.Model)``.

    The defaults serve a saved program as it is. A subclass may override any
    method; ``inputs`` / ``outputs`` class attributes (lists of ``TensorSpec`` or
    dicts with name/datatype/shape) declare what clients send and get when they
    differ from the program's.
    """

    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    predictor = None  # a Paddle Inference Predictor, with the inference backend
    backend = "jit"  # what runs this replica: "inference", "jit", a runtime, or why (auto's choice, a fallback)
    choice = None  # what backend auto measured (models/choice.py), as the config endpoint shows it
    # The call that runs the device's runtime session (ONNX Runtime, OpenVINO): host arrays in and out.
    runtime_run = None
    # An execute that works on the host (a pipeline step on a CPU worker: PaddleX's own pipeline) sets it:
    # its inputs come as the requests' host arrays, joined by numpy, never made tensors to be read back.
    takes_arrays = False

    def __init__(self) -> None:
        self.network: paddle.nn.Layer | None = None
        self.place = None
        self.context: ModelContext | None = None
        self._env: PlaceEnv | None = None  # PlaceEnv(place), made once: it keeps no state, so reuse is safe
        self._run_lock = threading.Lock()  # a Predictor's, shared with the replicas that share it
        self.shares_weights = False  # whether another replica's copy of the weights serves this one
        self._predictor_share: DeviceShare | None = None  # where this replica's Predictor came from
        self._native_run = None  # (the Predictor, the call that runs it without the GIL or None): backends'

    # -- lifecycle ---------------------------------------------------------------------------

    def initialize(self, place, context: ModelContext) -> None:
        """Load this replica on ``place``: by default the saved program, with a Predictor or
        ``paddle.jit.load`` (the config's ``backend``).

        Runs in the worker thread, whose device is already ``place``; PlaceEnv
        makes that explicit for loaders that create tensors.
        """
        self.place, self.context = placeenv.to_place(place), context
        self._env = PlaceEnv(self.place)
        backends.attach(self, context, self._written())

    def _written(self) -> backends.Written:
        """Which of the defaults this replica's class replaces (its model.py's own methods)."""
        kind = type(self)
        return backends.Written(load=kind.load is not Model.load, execute=kind.execute is not Model.execute,
                                initialize=kind.initialize is not Model.initialize)

    def rebuild(self, problem: str) -> bool:
        """After this replica's Predictor built but failed to run (its warm-up): a Predictor with oneDNN's
        fused convolutions only where all its kernels were on (Paddle 3.3's oneDNN executor cannot run some
        ops: PP-OCRv5's text detector's upsampling; PaddleX keeps a list of such models), without oneDNN
        where those were, else with backend ``auto`` ``paddle.jit.load``. False where none is left to try.
        ``backend`` says what runs it now, and why."""
        return backends.rebuild(self, problem, self._written())

    def load(self, context: ModelContext) -> paddle.nn.Layer | None:
        """The network to run; by default the version's saved program."""
        if context.program is None:
            raise RuntimeError("no saved program (model.json + model.pdiparams) and load() is not overridden")
        with JIT_LOAD_LOCK:
            return paddle.jit.load(str(context.program))

    def preprocess(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validated, normalised host arrays ``[batch, ...]`` for ``execute``; raise ``InputError``."""
        return inputs

    def execute(self, inputs: dict[str, paddle.Tensor]) -> dict[str, paddle.Tensor]:
        """Forward pass on this replica's place; ``inputs`` are already there, in ``self.context.inputs`` order."""
        if self.runtime_run is not None:  # host arrays in the program's order, and out
            out = self.runtime_run([host_array(inputs[spec.name]) for spec in self.context.inputs])
            return {spec.name: host_view(array) for spec, array in zip(self.context.outputs, out)}
        if self.predictor is not None:  # its outputs are in the program's order
            with self._run_lock:  # shared by the replicas on this device
                out = backends.run_predictor(self, [inputs[spec.name] for spec in self.context.inputs])
            return {spec.name: tensor for spec, tensor in zip(self.context.outputs, out)}
        if self.network is None:
            raise RuntimeError(f"{self.context.name if self.context else 'model'}: execute before initialize")
        with self._env, paddle.no_grad():  # tensors the forward creates land on this replica's place
            out = self.network(*inputs.values())
        if isinstance(out, paddle.Tensor):
            out = [out]
        if isinstance(out, Mapping):
            return dict(out)
        return {spec.name: tensor for spec, tensor in zip(self.context.outputs, out)}

    def postprocess(self, outputs: dict[str, paddle.Tensor]) -> dict[str, np.ndarray]:
        """Host arrays ``[batch, ...]``, one per declared output (an ``execute`` on the host may give them)."""
        return {name: value if isinstance(value, np.ndarray) else value.numpy() for name, value in outputs.items()}

    @property
    def request_parameters(self) -> Mapping[str, Any]:
        """The parameters of the request being served (v2's and gRPC's ``parameters``, but those the service
        reads itself), read-only; empty when it sent none. Valid in ``preprocess`` (that request's),
        ``execute`` and ``postprocess`` (the batch's: a batch joins only requests of the same parameters).
        A pipeline's steps and a model's calls get the request's parameters too."""
        found = SERVING.get().parameters
        return NO_PARAMETERS if found is None else MappingProxyType(found)

    def infer(self, model: str, inputs: Mapping[str, np.ndarray | paddle.Tensor], outputs: list[str] | None = None,
              version: int | None = None, parameters: Mapping[str, Any] | None = None,
              anywhere: bool = False) -> dict[str, np.ndarray]:
        """Run ``model`` (another of the repository) on ``inputs`` and return its outputs as host arrays:
        from ``execute`` or ``postprocess``, for a chain whose shape depends on the data (one detection,
        N crops, N recognitions), as Triton's BLS does.

        The call is a request of the one being served: through the same queues and batching, within
        its deadline (``Timeout`` past it, which answers that request 504), and refused if ``model`` is
        one this request is already inside of (a cycle). A tensor input moves only if ``model`` runs
        elsewhere. While it waits, the worker runs jobs from its own queue (the call's among them) of
        every model it holds but those it is already running, so it never waits for itself. The call has
        the served request's ``request_parameters`` unless ``parameters`` gives its own ({}: none). It runs on
        this worker's own device where that serves ``model`` (this worker serves it while it waits); with
        ``anywhere``, on the least loaded device serving it (an orchestrator on a CPU worker spreading its
        calls over the devices)."""
        return self.infer_all(model, [inputs], outputs, version, parameters, anywhere)[0]

    def infer_all(self, model: str, requests: list[Mapping[str, np.ndarray | paddle.Tensor]],
                  outputs: list[str] | None = None, version: int | None = None,
                  parameters: Mapping[str, Any] | None = None, anywhere: bool = False) -> list[dict[str, np.ndarray]]:
        """``infer`` for several requests to ``model`` at once, answered in their order: all are queued
        before any is waited for, so they run on as many workers as serve ``model`` and share forward
        passes with each other's and other requests' jobs of the same shape (Triton's BLS ``async_exec``
        awaited together). PaddleX's OCR calls its recogniser once for each group of crops."""
        context = SERVING.get()
        if context.call is None:
            raise ModelError("Model.infer calls another model from execute() or postprocess(), on the worker "
                             f"thread serving a request; this thread ({threading.current_thread().name}) serves "
                             "none (a thread of the model's own cannot call: infer_all sends several calls at once)")
        if context.thread != threading.get_ident():
            raise ModelError("Model.infer calls another model on the worker thread serving the request, not on "
                             f"another ({threading.current_thread().name}), even with its context copied: the "
                             "worker serves its queue while the call waits; infer_all sends several calls at once")
        if not requests:
            return []
        return context.call(model, version, [dict(inputs) for inputs in requests], outputs, context, parameters,
                            anywhere)

    def finalize(self) -> None:
        """Drop this replica's network (or Predictor), so its device memory can be reclaimed; what the
        replicas of a device share stays with the worker pool, for a replacement worker."""
        self.network, self.predictor, self._env, self._native_run = None, None, None, None
        self.runtime_run = None

    # -- what the service checks -------------------------------------------------------------

    def parameter_devices(self) -> dict[str, str]:
        """``{weight name: device}`` of the loaded network (state_dict covers buffers too); none for a
        Predictor, whose weights are in its own scope on the place its config names."""
        if self.network is None:
            return {}
        return {k: device_name(v.place) for k, v in self.network.state_dict().items()}

    def output_device(self) -> str:
        """Where ``execute``'s outputs belong, for the place checks.

        The worker's device, except for a saved program on a sim device: there
        Paddle runs the program's ops with CPU-fallback kernels and returns CPU
        tensors, though the parameters stay on ``sim:N`` (see docs/service.md).
        """
        device = device_name(self.place)
        if self.runtime_run is not None:  # a runtime's outputs are host arrays
            return "cpu"
        if self.context is not None and self.context.program is not None and device.startswith("sim:"):
            return "cpu"
        return device


def host_inputs(context: ModelContext, preprocessed: Any) -> dict[str, np.ndarray | paddle.Tensor]:
    """``preprocess``'s answer in the model's input order, numpy arrays and tensors as they are;
    ``ModelError`` naming an input it left out. ``batch_tensor`` makes the host tensor."""
    found = {}
    for spec in context.inputs:
        value = preprocessed.get(spec.name) if isinstance(preprocessed, Mapping) else None
        if value is None:
            raise ModelError(f"model {context.name!r}: preprocess returned no {spec.name!r}")
        found[spec.name] = value
    return found


def batch_tensor(parts: list[np.ndarray | paddle.Tensor]) -> paddle.Tensor:
    """One host tensor of ``parts`` joined along the first dimension (one part: the part itself).

    Host arrays are joined by numpy (one request: its own array) and the tensor is a view of them, no
    copy: the move to a device is the one copy, and a CPU worker's network reads them where they are.
    An array over a body's or a link frame's bytes (read-only, maybe unaligned: a model without a
    preprocess of its own) is copied, so that no execute writes into them. Tensors (a preprocess that
    makes them) are joined by Paddle, on their place.
    """
    if all(isinstance(part, np.ndarray) for part in parts):
        return request_tensor(parts[0]) if len(parts) == 1 else host_view(np.concatenate(parts))
    tensors = [request_tensor(part) if isinstance(part, np.ndarray) else part for part in parts]
    # One copy on the host (the inputs' place), not .numpy() + np.concatenate + a new
    # tensor, which holds the GIL several times longer (docs/benchmarks.md).
    return tensors[0] if len(tensors) == 1 else paddle.concat(tensors)


def request_tensor(array: np.ndarray) -> paddle.Tensor:
    """A host tensor of one request's array: a view of it (``host_view``), or a copy (``host_tensor``) of an
    array over a body's or a link frame's bytes, read-only and maybe unaligned, that no execute may write."""
    flags = array.flags
    return host_view(array) if flags.writeable and flags.aligned else host_tensor(array)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax on the host."""
    values = logits.astype(np.float64)
    values = np.exp(values - values.max(axis=1, keepdims=True))
    return (values / values.sum(axis=1, keepdims=True)).astype(logits.dtype)
