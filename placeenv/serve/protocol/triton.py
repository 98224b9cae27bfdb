"""A model's config in Triton's ``ModelConfig`` schema, so Triton's tools (tritonclient,
perf_analyzer, model_analyzer) read it: the fields Triton has, named and typed as Triton's
``model_config.proto`` does, and every setting of ours that Triton has no field for in its
``parameters`` map, each as ``{"string_value": ...}`` (JSON for what is not a string).

``GET /v2/models/{m}/config`` answers this dict; gRPC's ``ModelConfig`` the same, parsed into
tritonclient's ``ModelConfig`` message.
"""

from __future__ import annotations

import json
from typing import Any

from .request import ModelInfo, VersionInfo

#: Our datatypes (the protocol's) as Triton's config spells them.
DATA_TYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING", "BF16": "TYPE_BF16",
}

#: The config file's fields that have a Triton field of their own (the rest go to ``parameters``).
MAPPED = frozenset({"name", "max_batch_size", "instance_group", "pipeline", "version_policy"})


def kind_of(device_kind: str) -> str:
    """Triton's instance kind of a device kind: a GPU, the CPU, or a device Triton has no kind for
    (sim, xpu, a custom device), where the model itself places its instances (KIND_MODEL)."""
    return {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}.get(device_kind, "KIND_MODEL")


def instance_groups(config: dict[str, Any], devices: list[str], workers_per_device: int) -> list[dict[str, Any]]:
    """The config's instance_group, or (none set: every worker of every device loads the model) one
    group per device kind served, with a worker per device each."""
    groups = config.get("instance_group")
    if groups:
        return [{"kind": kind_of(g["kind"]), "count": g["count"]} for g in groups]
    found: dict[str, dict[str, Any]] = {}
    for device in devices:
        kind, _, index = device.partition(":")
        group = found.setdefault(kind, {"kind": kind_of(kind), "count": workers_per_device})
        if kind == "gpu":
            group.setdefault("gpus", []).append(int(index or 0))
    return list(found.values())


def tensors(specs, batched: bool) -> list[dict[str, Any]]:
    """Inputs or outputs: ``dims`` leave out the batch dimension when the model batches, as Triton's do."""
    return [{"name": s.name, "data_type": DATA_TYPES[s.datatype],
             "dims": list(s.shape[1:] if batched else s.shape)} for s in specs]


def _set(value: Any) -> Any:
    """``value`` without its None fields, at every depth: a oneof of Triton's holds only the one set."""
    if isinstance(value, dict):
        return {k: _set(v) for k, v in value.items() if v is not None}
    return value


def parameter(value: Any) -> dict[str, str]:
    return {"string_value": value if isinstance(value, str) else json.dumps(value, sort_keys=True)}


def model_config(model: ModelInfo, chosen: VersionInfo, devices: list[str], workers_per_device: int) -> dict[str, Any]:
    """Triton's ``ModelConfig`` of ``model``'s version ``chosen``, as a dict for ``json_format.ParseDict``."""
    config = model.config
    batched = model.max_batch_size > 0
    found: dict[str, Any] = {
        "name": model.name, "platform": chosen.platform, "max_batch_size": model.max_batch_size,
        # The config's policy as Triton writes it; none: the versions served (Triton's latest 1 when one is).
        "version_policy": _set(config.get("version_policy")) or (
            {"latest": {"num_versions": 1}} if len(model.versions) == 1
            else {"specific": {"versions": sorted(model.versions)}}),
        "input": tensors(chosen.inputs, batched), "output": tensors(chosen.outputs, batched),
    }
    steps = config.get("pipeline")
    if steps:  # a pipeline: Triton's ensemble, whose steps are scheduled by the server
        found["ensemble_scheduling"] = {"step": [
            {"model_name": s["model"], "model_version": s.get("version") or -1,
             "input_map": dict(s["inputs"]), "output_map": dict(s.get("outputs") or {})} for s in steps]}
    else:
        found["instance_group"] = instance_groups(config, devices, workers_per_device)
        if batched:  # requests are joined into batches on each device's queue
            found["dynamic_batching"] = {"max_queue_delay_microseconds": round(model.max_batch_delay_ms * 1000)}
    extras = {key: value for key, value in config.items() if key not in MAPPED and value is not None}
    if not steps:
        extras["max_batch_delay_ms"] = model.max_batch_delay_ms
    found["parameters"] = {key: parameter(value) for key, value in sorted(extras.items())}
    return found
