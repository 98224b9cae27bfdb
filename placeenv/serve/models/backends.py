"""What runs a replica, and what the replicas of a device share: the backend chosen for a version (a
Paddle Inference Predictor, ``paddle.jit.load``, models/inference.py, or ONNX Runtime or OpenVINO,
models/runtimes.py; ``auto`` measures them, models/choice.py), the rebuild of a Predictor that fails its
first run, and one copy of the weights a device.

``Model.initialize`` and ``Model.rebuild`` (base.py), which users subclass and call with ``super()``, hand
their replica here: the defaults' decisions live apart from the contract users write against. ``replica``
is a ``Model``; this module names none of base.py (base.py imports it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Any

import numpy as np
import paddle

from placeenv import PlaceEnv, device_name, native
from placeenv.tensors import JIT_LOAD_LOCK, host_view

from . import choice, inference, runtimes

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Written:
    """Which defaults a replica's class replaces with its model.py's own: a model.py that loads its own
    network keeps it; one with its own ``execute()`` or ``initialize()`` was written against
    ``self.network``."""

    load: bool
    execute: bool
    initialize: bool


@dataclasses.dataclass(eq=False)
class DeviceShare:
    """What the replicas of one model version on one device share: one copy of its weights.

    The first replica's network (or Predictor) is kept here. A later replica's network takes
    its parameters and buffers (``adopt_weights``) and keeps its own program, scope and
    interpreter: Paddle 3.3 caches a ``jit.load``ed layer's interpreter and scope per layer
    without a lock, so threads calling forward on one layer crash (docs/models.md, "One copy
    of the weights"). A Predictor is used by all of them under ``run_lock``, one run at a time; on the
    CPU, where runs leave the GIL, each worker has one of its own instead unless the config asks to share.
    """

    adopting: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    network: paddle.nn.Layer | None = None
    predictor: Any = None
    run_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    #: The options the Predictor was rebuilt with after its first one failed to run (``Model.rebuild``):
    #: the next replica that finds its own failing takes this one.
    rebuilt: inference.InferenceOptions | None = None
    #: A runtime's session (ONNX Runtime, OpenVINO), made once and run by every worker of the device.
    session: runtimes.Session | None = None
    #: What ``auto`` measured for the device (choice.py): the first replica measures, the others take it.
    choosing: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    choice: choice.Choice | None = None


def adopt_weights(network: paddle.nn.Layer, source: paddle.nn.Layer) -> bool:
    """Make ``network``'s parameters and buffers ``source``'s tensors, so one copy serves both;
    False, changing nothing, unless their names, shapes and dtypes all match.

    For a ``jit.load``ed layer it must run before the layer's first forward, which binds the
    tensors it finds then into its program."""
    mine, theirs = network.state_dict(), source.state_dict()
    layers, sources = dict(network.named_sublayers(include_self=True)), dict(source.named_sublayers(include_self=True))
    if mine.keys() != theirs.keys() or layers.keys() != sources.keys() or any(
            mine[k].shape != theirs[k].shape or mine[k].dtype != theirs[k].dtype for k in mine):
        return False
    for prefix, layer in layers.items():
        for name, parameter in sources[prefix].named_parameters(include_sublayers=False):
            layer.add_parameter(name, parameter)
        for name, buffer in sources[prefix].named_buffers(include_sublayers=False):
            layer.register_buffer(name, buffer, persistable=f"{prefix}.{name}".lstrip(".") in theirs)
    return True



def attach(replica, context, written: Written) -> None:
    """Give ``replica`` (its place and context set) what runs it: a Predictor, a runtime's session, or the
    network ``load()`` makes, as the config's ``backend`` and what its class replaces allow; the device's
    shared copy where the config's ``share_weights`` (or, unset, the defaults) allow. ``replica.backend``
    says which, and ``replica.choice`` what ``auto`` measured."""
    own = written.execute or written.initialize  # auto keeps jit.load for it (backend: inference opts in)
    device = device_name(replica.place)
    plain = not written.load and context.program is not None
    defaults = not written.load and not written.initialize
    sharing = context.share if context.share_weights or (context.share_weights is None and defaults) else None
    if context.backend in runtimes.RUNTIMES:
        _runtime(replica, context, written, device, sharing)
        return
    if context.backend == "auto" and plain and not own and (why := inference.why_jit(device, context.accelerators)):
        replica.backend = why
    measured = None
    if (context.backend == "auto" and plain and not own and context.samples
            and inference.chosen("auto", device, context.accelerators) == "inference"):
        measured = _measured(replica, context, device)
    if measured is not None:
        replica.choice = measured.describe()
        if measured.inference is not None:
            context = replica.context = dataclasses.replace(context, inference=measured.inference)
        if measured.session is not None:
            session = measured.session if sharing is not None else runtimes.open_session(
                measured.serves, context.program, device, context.runtime)
            replica.runtime_run, replica.backend = session.runner(), measured.summary()
            replica.shares_weights = sharing is not None
            return
    if (plain and not (own and context.backend == "auto")
            and (measured is None or measured.serves == "inference")
            and inference.chosen(context.backend, device, context.accelerators) == "inference"):
        # A model.py's own execute() would run a shared Predictor without its lock: it gets its own. So does
        # each worker where runs leave the GIL, unless the config asks to share: one Predictor runs one at a
        # time, and Paddle's clone() copies the weights as a new Predictor does.
        alone = written.execute or (context.share_weights is None and _runs_overlap(replica))
        if _predictor(replica, context, None if alone else sharing):
            if measured is not None:
                replica.backend = measured.summary()
            return
    _network(replica, context, sharing)
    if measured is not None and measured.serves == "jit":
        replica.backend = measured.summary()


def _measured(replica, context, device: str) -> choice.Choice | None:
    """What ``auto`` chooses for ``replica``'s version on ``device``: measured by the first of the device's
    replicas (``context.share``), taken by the others; None where it could not be measured (no backend runs
    the program: the Predictor's path then says why)."""
    share = context.share
    with share.choosing if share is not None else contextlib.nullcontext():
        if share is not None and share.choice is not None:
            return share.choice
        with PlaceEnv("cpu"):  # the model's own preprocess, on the host, as a batch's
            prepared = [replica.preprocess({name: array.copy() for name, array in arrays.items()})
                        for arrays in context.samples]
            samples = [[np.asarray(one[spec.name]) for spec in context.inputs] for one in prepared]
        try:
            found = choice.measure(context.program, replica.place, device, context, samples)
        except Exception as exc:  # noqa: BLE001 - served as before measuring, which says what fails
            say_once(context, f"model {context.name!r} version {context.version} on {device}: backend auto could "
                     f"not measure ({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}); "
                     "it takes a Predictor, as without a runtime")
            return None
        if share is not None:
            share.choice = found
            share.session = found.session
        log.info("model %r version %s on %s: %s", context.name, context.version, device, found.summary())
        return found


def _runtime(replica, context, written: Written, device: str, sharing: DeviceShare | None) -> None:
    """``replica`` runs the config's runtime (ONNX Runtime or OpenVINO) on the device's session; an error
    naming why it cannot, which fails the load before the version is ready."""
    name = context.backend
    if context.program is None or written.load or written.execute:
        raise RuntimeError(f"backend {name} runs the version's saved program through the default load() and "
                           "execute(); this model.py has its own: use backend auto, jit or inference")
    why = runtimes.unavailable(name, device)
    if why is not None:
        raise RuntimeError(f"backend {name} cannot run on {device}: {why}")
    with sharing.adopting if sharing is not None else contextlib.nullcontext():
        session = sharing.session if sharing is not None and sharing.session is not None else None
        if session is None:
            try:
                session = runtimes.open_session(name, context.program, device, context.runtime)
            except runtimes.ConversionFailed as exc:
                raise RuntimeError(f"backend {name}: {exc}") from None
            if sharing is not None:
                sharing.session = session
    replica.runtime_run, replica.backend = session.runner(), name
    replica.shares_weights = sharing is not None


def _predictor(replica, context, share: DeviceShare | None) -> bool:
    """A Predictor for ``replica``, from the device's where ``share`` has one; False where Paddle Inference
    cannot load the program and ``auto`` lets jit.load serve it instead."""
    try:
        with JIT_LOAD_LOCK:  # a Predictor builds its program through the same global insertion point
            if share is not None and share.predictor is not None:
                replica.predictor, replica._run_lock, replica.shares_weights = share.predictor, share.run_lock, True
            else:
                replica.predictor = inference.create(context.program, replica.place, context.inference)
                if share is not None:
                    share.predictor, replica._run_lock = replica.predictor, share.run_lock
            replica._predictor_share = share
        replica.backend = "inference"
        return True
    except Exception as exc:
        problem = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
        if context.backend == "inference":
            raise RuntimeError(f"Paddle Inference cannot load the program (backend: inference): "
                               f"{problem}") from None
        replica.backend = f"jit (backend auto: Paddle Inference could not load the program: {problem})"
        say_once(context, f"model {context.name!r} version {context.version}: Paddle Inference "
                 f"could not load the program ({problem}); serving it with paddle.jit.load")
        return False


def _runs_overlap(replica) -> bool:
    """Whether ``replica``'s Predictor runs without the GIL (placeenv.native, on the CPU), so that runs of
    several Predictors overlap."""
    return device_name(replica.place) == "cpu" and native.unavailable() is None


def run_predictor(replica, inputs: list) -> list:
    """One run of ``replica``'s Predictor (its run lock held) on ``inputs``, in the program's order: its
    outputs as tensors, copied where replicas share the Predictor (the binding's are its output variables,
    which its next run writes over; a run without the GIL copies them out anyway)."""
    predictor = replica.predictor
    if replica._native_run is None or replica._native_run[0] is not predictor:
        replica._native_run = (predictor, _native_run(replica))
    run = replica._native_run[1]
    if run is None:
        out = predictor.run(inputs)
        return [tensor.clone() for tensor in out] if replica._predictor_share is not None else out
    for name, tensor in zip(predictor.get_input_names(), inputs, strict=True):
        predictor.get_input_handle(name).share_external_data(tensor)  # no copy: it lives through the run
    run()
    return [host_view(predictor.get_output_handle(name).copy_to_cpu()) for name in predictor.get_output_names()]


def host_array(value) -> np.ndarray:
    """A runtime's input: a host array as it is, a CPU tensor's memory without a copy (DLPack), another
    device's tensor copied to the host."""
    if isinstance(value, np.ndarray):
        return value
    if value.place.is_cpu_place():
        return np.from_dlpack(value)
    return value.numpy()


def _native_run(replica):
    """The call that runs ``replica``'s Predictor without the GIL, or None: off the CPU (Paddle narrowed its
    own GIL release to npu plugins after crashes with several threads on GPUs), or where this process has
    none (said once in the log)."""
    if device_name(replica.place) != "cpu":
        return None
    run = native.runner(replica.predictor)
    if isinstance(run, str):
        say_once(replica.context, f"model {replica.context.name!r} version {replica.context.version}: its "
                 f"Predictor's runs hold the GIL, so they take turns with every other thread's: {run}")
        return None
    return run


def _network(replica, context, sharing: DeviceShare | None) -> None:
    """``replica.load()``'s network, taking the device's copy of the weights where ``sharing`` has one."""
    with sharing.adopting if sharing is not None else contextlib.nullcontext():
        source = sharing.network if sharing is not None else None
        # A replica that adopts the device's copy loads its own on the host, freed once adopted, so the
        # device never holds a second copy, not even in its allocator's cache.
        with PlaceEnv("cpu") if source is not None else replica._env:
            replica.network = replica.load(context)
        if replica.network is not None and source is not None:
            replica.shares_weights = adopt_weights(replica.network, source)
            if not replica.shares_weights:  # another network: its own copy, on its device
                with replica._env:
                    replica.network = replica.load(context)
        if replica.network is not None and sharing is not None and source is None:
            sharing.network = replica.network
    if replica.network is not None:
        replica.network.eval()


def rebuild(replica, problem: str, written: Written) -> bool:
    """``replica``'s Predictor built but failed its first run (``problem``): rebuilt with oneDNN's fused
    convolutions only where all of oneDNN's kernels were on, without oneDNN where those were, else, with
    backend ``auto`` and the default ``load()``, replaced by jit.load. False where none is left to try."""
    context, share = replica.context, replica._predictor_share
    if replica.predictor is None:
        return False
    why = (problem.strip().splitlines() or [""])[0][:200]
    if context.inference.onednn and device_name(replica.place) == "cpu":
        options = context.inference.model_copy(
            update={"onednn_ops": "fused"} if context.inference.onednn_ops == "all" else {"onednn": False})
        with JIT_LOAD_LOCK:
            if share is not None and share.rebuilt is not None and _step(share.rebuilt) >= _step(options):
                # Another replica rebuilt the device's one this far already: this one takes it, and its options.
                replica.predictor, options = share.predictor, share.rebuilt
            else:
                replica.predictor = inference.create(context.program, replica.place, options)
                if share is not None:
                    share.predictor, share.rebuilt = replica.predictor, options
        replica.context = dataclasses.replace(context, inference=options)
        how = ("oneDNN for its fused convolutions only: with all its kernels" if options.onednn
               else "oneDNN off: with it")
        replica.backend = f"inference ({how} the program failed to run: {why})"
        say_once(context, f"model {context.name!r} version {context.version}: {replica.backend}")
        return True
    if context.backend != "auto" or written.load:
        return False
    replica.predictor, replica._predictor_share, replica._native_run = None, None, None
    with replica._env:
        replica.network = replica.load(context)
    replica.network.eval()
    replica.backend = f"jit (backend auto: Paddle Inference could not run the program: {why})"
    say_once(context, f"model {context.name!r} version {context.version}: {replica.backend}")
    return True


def _step(options: inference.InferenceOptions) -> int:
    """How far along the rebuild's steps ``options`` are: all of oneDNN, its fused convolutions, none."""
    return 2 if not options.onednn else 1 if options.onednn_ops == "fused" else 0


_said: set[tuple[str, int, str]] = set()
_said_lock = threading.Lock()


def say_once(context, message: str) -> None:
    """Log ``message`` once per model version, however many workers find it."""
    with _said_lock:
        if (context.name, context.version, message) in _said:
            return
        _said.add((context.name, context.version, message))
    log.warning("%s", message)
