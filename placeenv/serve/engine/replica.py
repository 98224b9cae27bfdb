"""A worker's replica of a model version: built on the worker's own thread, on its device, with the
weights its device's workers share, place-checked and warmed up before it serves; finalized when it
leaves.

A replica belongs to the served version it serves (generation.py): built by ``build`` on its worker's
thread, at the worker's start (``Holding.load``) and for a load (``stage``, the control's task on the
worker), and finalized there once no generation serves it (``finalize_all``) or its worker ends
(``Holding.release``). No thread of its own: the worker's thread calls each, between two batches.
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


def stage(slot: Slot, entry: Entry, numbers: Iterable[int]) -> dict[Key, Model]:
    """Replicas of ``entry``'s versions ``numbers`` built and warmed up on this thread (``slot``'s worker's),
    beside those it serves; on a failure, what was built is finalized."""
    built: dict[Key, Model] = {}
    try:
        for number in numbers:
            built[entry.name, number] = build(slot, entry, entry.versions[number])
    except Exception:
        finalize_all(built.values(), slot.name)
        raise
    return built


def finalize_all(replicas: Iterable[Model], worker: str) -> None:
    """Each of ``replicas`` finalized (on its worker's thread)."""
    for replica in replicas:
        finalize(replica, worker)


class Holding:
    """What one worker's slot holds: the replicas its worker builds when it starts, and those it lets go of
    when its thread ends. The replicas belong to the served versions (generation.py, ``Slots``): at the
    service's start the engine builds the first generation on what each worker loaded of its ``entries``;
    a worker that replaces a dead one under the same name (``replacement``) refills its slot in each version
    that names it. ``served``: the engine's, whose generations say which versions name the slot (None: a
    worker of no engine, a test's). No thread of its own: the worker's calls it."""

    def __init__(self, slot: Slot, entries: list[Entry], served=None, replacement: bool = False) -> None:
        self.slot, self.entries, self.served, self.replacement = slot, entries, served, replacement

    def load(self) -> tuple[dict[Key, Model], dict[str, str]]:
        """The replicas built (at the service's start: every version of ``entries``; for a replacement, none
        to hand back: each is in its slot already), and the models that did not load, with why."""
        if self.replacement:
            return {}, self._refill()
        built, failed = {}, {}
        entries, self.entries = self.entries, []  # from here on, the generation says what the worker holds
        for entry in entries:
            try:
                built.update(stage(self.slot, entry, list(entry.versions)))
            except Exception as exc:  # noqa: BLE001 - reported by the service, named
                failed[entry.name] = self._failed(entry.name, exc)
        return built, failed

    def _refill(self) -> dict[str, str]:
        failed = {}
        for served in self._held():
            slots = served.replicas
            try:
                slots.refill(self.slot.name, build(self.slot, served.entry, served.version))
            except Exception as exc:  # noqa: BLE001 - the slot is left empty: its jobs go to the other workers
                slots.vacate(self.slot.name)
                failed[served.entry.name] = self._failed(served.entry.name, exc)
        return failed

    def _failed(self, model: str, exc: Exception) -> str:
        why = f"{type(exc).__name__}: {str(exc)[:500]}"
        log.error("worker %s: model %r did not load on %s: %s", self.slot.name, model, self.slot.device, why)
        return why

    def _held(self) -> list:
        """The served versions whose replicas name this slot, in the generations serving or retiring, each
        once (one version's replicas are shared by the generations that serve it)."""
        if self.served is None:
            return []
        found = {}
        for generation in (self.served.generation, *self.served.retiring):
            for served in generation.held_by(self.slot.name):
                found.setdefault(id(served.replicas), served)
        return list(found.values())

    def release(self) -> None:
        """The worker's thread ends: each replica it holds finalized."""
        finalize_all([served.replicas[self.slot.name] for served in self._held() if self.slot.name in served.replicas],
                     self.slot.name)


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
