"""A worker's replica of a model version: built on the worker's own thread, on its device, with the
weights its device's workers share, place-checked and warmed up before it serves; finalized when it
leaves.

A worker (worker.py) keeps its replicas in a ``Replicas``: each built by ``build`` at its start and for
a load (``stage``), put in service (``install``), dropped and finalized (``drop``). No thread of its own:
the worker's thread calls each, between two batches.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable

from placeenv import PlaceEnv

from ..models.backends import DeviceShare
from ..models.base import Model, host_inputs
from ..models.repository import Entry
from .forward import forward, rows_of, unchecked

log = logging.getLogger(__name__)

#: Held around each replica's build and warm-up with isolation off (``build``), and around a worker's
#: first ``set_device`` (``Worker``).
STOCK_BUILDS = threading.Lock()


#: A served version: (model, version).
Key = tuple[str, int]


class Replicas:
    """A worker's replicas of the versions it serves (``models``), with their batch limits (``held``: what
    it takes batches of), what runs each (``backends``, ``choices``: what backend auto measured), and the
    models of ``entries`` that did not load at its start (``failed``, why). A load stages new replicas
    beside these and installs them; new dicts, not changed ones: the worker's thread reads them without a
    lock."""

    def __init__(self, slot: Slot, entries: list[Entry]) -> None:
        self.slot, self.entries = slot, entries
        self.models: dict[Key, Model] = {}
        self.held: dict[Key, tuple[int, float]] = {}
        self.backends: dict[Key, str] = {}
        self.choices: dict[Key, dict] = {}
        self.failed: dict[str, str] = {}

    def load_all(self) -> None:
        """Load and serve every version of each of ``entries`` (at start), or say why not (``failed``)."""
        for entry in self.entries:
            try:
                loaded = self.stage(entry, list(entry.versions))
            except Exception as exc:  # noqa: BLE001 - reported by the service, named
                self.failed[entry.name] = f"{type(exc).__name__}: {str(exc)[:500]}"
                log.error("worker %s: model %r did not load on %s: %s", self.slot.name, entry.name,
                          self.slot.device, self.failed[entry.name])
                continue
            self.install(entry, loaded)

    def stage(self, entry: Entry, numbers: list[int]) -> dict[Key, Model]:
        """Build and warm up replicas of ``entry``'s versions ``numbers`` on this thread, beside those it
        serves (``install`` puts them in service); on a failure, what was built is finalized."""
        built: dict[Key, Model] = {}
        try:
            for number in numbers:
                built[entry.name, number] = build(self.slot, entry, entry.versions[number])
        except Exception:
            for replica in built.values():
                finalize(replica, self.slot.name)
            raise
        return built

    def install(self, entry: Entry, built: dict[Key, Model]) -> dict[Key, Model]:
        """Serve ``built`` (``stage``'s) from the next batch on; the replicas they replace, to drop."""
        replaced = {key: self.models[key] for key in built if key in self.models}
        delay = entry.max_batch_delay_ms / 1000
        self.models = {**self.models, **built}
        self.held = {**self.held, **{key: (entry.max_batch_size, delay) for key in built}}
        self.backends = {**self.backends, **{key: replica.backend for key, replica in built.items()}}
        self.choices = {**{k: c for k, c in self.choices.items() if k not in built},
                        **{key: replica.choice for key, replica in built.items() if replica.choice is not None}}
        return replaced

    def drop(self, keys: Iterable[Key], replaced: dict[Key, Model] | None = None) -> None:
        """On the worker's thread: stop serving ``keys`` and finalize their replicas (and ``replaced``, the
        ones a new build took the place of, or a failed load built); the engine's control then collects
        them and hands the device's memory back."""
        keys = set(keys)
        gone = [self.models[key] for key in keys if key in self.models] + list((replaced or {}).values())
        self.held = {key: held for key, held in self.held.items() if key not in keys}
        self.models = {key: replica for key, replica in self.models.items() if key not in keys}
        self.backends = {key: found for key, found in self.backends.items() if key not in keys}
        self.choices = {key: found for key, found in self.choices.items() if key not in keys}
        for replica in gone:
            finalize(replica, self.slot.name)

    def finalize_all(self) -> None:
        """The worker's thread ends: every replica finalized."""
        for replica in self.models.values():
            finalize(replica, self.slot.name)


class WarmUpFailed(RuntimeError):
    """A warm-up request failed: which (``label``), and the ``problem`` as the model raised it."""

    def __init__(self, label: str, problem: str) -> None:
        super().__init__(f"{label} failed: {problem}")
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where a replica is built: its worker's name, device and place, the worker's place checker, whether
    placeenv isolates the thread, the process's accelerators, and the weights its device's workers share
    (None: each replica loads its own)."""

    name: str
    device: str
    place: object
    check: object
    isolation: bool
    accelerators: int = 1
    shares: Shares | None = None


def build(slot: Slot, entry: Entry, version) -> Model:
    """``version``'s replica on ``slot``'s device, on this thread (the worker's): initialized, its weights'
    places checked, warmed up; finalized again when any of that fails."""
    if slot.isolation:
        return _build(slot, entry, version)
    # Stock Paddle (isolation off) has one Tracer for all threads, which jit.load switches to static
    # mode while it builds: another worker's warm-up forward then breaks the load. One at a time.
    with STOCK_BUILDS:
        return _build(slot, entry, version)


def _build(slot: Slot, entry: Entry, version) -> Model:
    replica = version.model_class()
    # The replica decides whether it takes the share (its config's share_weights, its own code).
    share = (slot.shares.get(slot.device, entry.name, version.number, version.fingerprint)
             if slot.shares is not None else None)
    replica.initialize(slot.place, replica_context(entry, version, accelerators=slot.accelerators, share=share))
    stray = {k: d for k, d in replica.parameter_devices().items() if d != slot.device}
    slot.check("load", next(iter(stray.values()), slot.device))
    if stray and slot.isolation:
        finalize(replica, slot.name)
        raise RuntimeError(f"weights not on {slot.device} after initialize: {dict(list(stray.items())[:3])}")
    try:
        warm_up(replica, entry, version, slot.check)
    except Exception:
        finalize(replica, slot.name)
        raise
    return replica


def replica_context(entry: Entry, version, **given):
    """``version``'s context as a replica of ``entry`` gets it: with its warm-up requests' arrays and the
    entry's batch size (what backend auto measures on; a PaddleX export used twice takes the larger batch
    after it is read), and ``given`` (the worker's share, its process's accelerators)."""
    return dataclasses.replace(version.context, samples=tuple(arrays for _, arrays in version.warmup),
                               max_batch_size=entry.max_batch_size, **given)


def warm_up(replica: Model, entry: Entry, version, check=None) -> None:
    """Run the version's warm-up requests (its config's ``warmup``, or the default one) through ``replica``
    as a batch runs: preprocess on the host, forward, postprocess. A Predictor builds and allocates at its
    first run: this is that run, before the worker (or a load) says the version is ready. A Predictor that
    built but fails it is rebuilt as it can be (``Model.rebuild``: oneDNN's fused ops only, oneDNN off, or
    jit) and warmed again."""
    while True:
        try:
            for label, arrays in version.warmup:
                try:
                    with PlaceEnv("cpu"):
                        prepared = host_inputs(replica.context, replica.preprocess(
                            {name: array.copy() for name, array in arrays.items()}))
                    examples = rows_of(next(iter(arrays.values()))) if entry.max_batch_size > 0 else 1
                    forward(replica, [prepared], entry.max_batch_size > 0, examples, check or unchecked)
                except Exception as exc:
                    raise WarmUpFailed(label, f"{type(exc).__name__}: {str(exc)[:400]}") from None
            return
        except WarmUpFailed as exc:
            if not replica.rebuild(exc.problem):
                raise


def finalize(replica: Model, worker: str) -> None:
    """``replica.finalize()``; a failure is logged (the replica is let go of either way)."""
    try:
        replica.finalize()
    except Exception:
        log.exception("worker %s: finalize failed", worker)


class Shares:
    """One ``DeviceShare`` for each (device, model, version, its files' fingerprint): what its workers
    share while it is served, so a replacement worker takes the same copy of the weights, and a version
    loaded again from changed files does not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shares: dict[tuple[str, str, int, str], DeviceShare] = {}

    def get(self, device: str, model: str, version: int, fingerprint: str = "") -> DeviceShare:
        with self._lock:
            return self._shares.setdefault((device, model, version, fingerprint), DeviceShare())

    def forget(self, model: str, version: int, fingerprint: str) -> None:
        """Let go of a version's weights (unloaded, or loaded again from changed files)."""
        with self._lock:
            for key in [k for k in self._shares if k[1:] == (model, version, fingerprint)]:
                del self._shares[key]
