"""The warm-up requests each worker runs through a version before it is ready (the config's ``warmup``,
Triton's model_warmup): their arrays, made and checked against the version's inputs as it is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..protocol.wire import DATATYPES
from .base import Model, TensorSpec
from .configs import RepositoryError, WarmupSample
from .entries import Entry, Version


def warmup_requests(entry: Entry, version: Version) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The arrays of each warm-up request of ``version`` (its config's ``warmup``), checked against its
    inputs; ``RepositoryError`` naming the sample and what is wrong."""
    found = []
    where = entry.config_file or entry.directory
    rng = np.random.default_rng(0)
    samples = entry.config.warmup
    default = samples is None
    if default:
        samples = default_warmup(entry, version)
    for i, sample in enumerate(samples):
        def refuse(problem: str) -> RepositoryError:
            return RepositoryError(entry.name, where, f"warmup[{i}]: {problem}")

        specs = {spec.name: spec for spec in version.inputs}
        for kind, named in (("dims", sample.dims), ("files", sample.files)):
            unknown = [n for n in named if n not in specs]
            if unknown:
                raise refuse(f"{kind} names input {unknown[0]!r}; the inputs are {', '.join(specs)}")
        batched = entry.max_batch_size > 0
        if not batched and sample.batch_sizes != [1]:
            raise refuse(f"batch_sizes {sample.batch_sizes}: the model does not batch (max_batch_size 0); use [1]")
        if batched and max(sample.batch_sizes) > entry.max_batch_size:
            raise refuse(f"batch size {max(sample.batch_sizes)} is over the model's max_batch_size "
                         f"{entry.max_batch_size}")
        examples: dict[str, np.ndarray] = {}  # each input's one example (its batch dimension left out)
        for spec in version.inputs:
            shape = list(spec.shape[1:] if batched else spec.shape)
            if spec.name in sample.dims:
                given = sample.dims[spec.name]
                if len(given) != len(shape) or any(g < 1 or s not in (-1, g) for g, s in zip(given, shape)):
                    raise refuse(f"dims {given} for input {spec.name!r} do not fit its shape "
                                 f"{list(spec.shape)} (without the batch dimension: {shape})")
                shape = given
            if sample.data == "file":
                examples[spec.name] = _sample_file(refuse, entry.directory, spec, sample.files.get(spec.name),
                                                   shape)
                continue
            if -1 in shape:
                raise refuse(f"input {spec.name!r} has a dynamic dimension ({list(spec.shape)}): give its "
                             f"size in dims")
            if spec.datatype == "BYTES":
                raise refuse(f"input {spec.name!r} is BYTES: warm it up with data: file and a sample in files")
            dtype = DATATYPES[spec.datatype]
            if sample.data == "zero":
                examples[spec.name] = np.zeros(shape, dtype)
            elif dtype == np.bool_:
                examples[spec.name] = rng.integers(0, 2, shape).astype(dtype)
            elif np.issubdtype(dtype, np.integer):
                examples[spec.name] = rng.integers(0, 10, shape).astype(dtype)
            else:
                examples[spec.name] = rng.random(shape).astype(dtype)
        for size in sample.batch_sizes:
            arrays = {name: np.stack([one] * size) if batched else one for name, one in examples.items()}
            label = (f"the default warm-up (zeros: {', '.join(f'{n} {list(a.shape)}' for n, a in arrays.items())}; "
                     "the config's warmup sets others, warmup: [] none)" if default else f"warmup[{i}] batch {size}")
            found += [(label, arrays)] * sample.count
    return found


#: A dynamic dimension's size in the default warm-up where the model's files do not give one.
DEFAULT_DIM = 32


def default_warmup(entry: Entry, version: Version) -> list[WarmupSample]:
    """One request of zeros through a version whose saved program a backend runs (a Predictor may build
    and still fail at its first run: oneDNN on some programs), so that is found before ready. Dynamic
    dimensions take the sizes a PaddleX export's inference.yml calls typical (its dynamic shapes' ``opt``),
    else ``DEFAULT_DIM`` (1 for a first dimension the model does not batch on). None for a version whose
    ``execute`` is its own code (it may call other models) or that takes BYTES (its samples are files)."""
    if (version.program is None or version.model_class.execute is not Model.execute
            or any(spec.datatype == "BYTES" for spec in version.inputs)):
        return []
    typical = typical_shapes(version.context.directory)
    batched = entry.max_batch_size > 0
    dims = {}
    for spec in version.inputs:
        shape = list(spec.shape[1:] if batched else spec.shape)
        if -1 not in shape:
            continue
        known = typical.get(spec.name)
        known = known[1:] if known is not None and batched else known
        if known is not None and len(known) == len(shape) and all(s in (-1, k) for s, k in zip(shape, known)):
            dims[spec.name] = known
        else:
            dims[spec.name] = [s if s != -1 else 1 if i == 0 and not batched else DEFAULT_DIM
                               for i, s in enumerate(shape)]
    return [WarmupSample(dims=dims)]


def typical_shapes(directory: Path) -> dict[str, list[int]]:
    """Each input's typical shape, batch dimension included, from a PaddleX export's inference.yml (the
    ``opt`` of ``Hpi.backend_configs.paddle_infer.trt_dynamic_shapes``); none where it says nothing."""
    path = directory / "inference.yml"
    if not path.is_file():
        return {}
    try:
        import yaml  # pyyaml, the service's

        # libyaml's safe loader where pyyaml has it: a recogniser's file holds its character dictionary (some
        # 18,000 lines), 0.48 s a load in pure Python, 0.05 s in C, the same mapping.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        shapes = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)["Hpi"]["backend_configs"]["paddle_infer"][
            "trt_dynamic_shapes"]
        return {name: [int(d) for d in ranges[1]] for name, ranges in shapes.items()
                if all(int(d) > 0 for d in ranges[1])}
    except Exception:  # noqa: BLE001 - not one of PaddleX's: the plain defaults
        return {}


def _sample_file(refuse, directory: Path, spec: TensorSpec, relative: str | None, shape: list[int]) -> np.ndarray:
    """One example of input ``spec`` from its sample file, inside the model's ``directory``."""
    if relative is None:
        raise refuse(f"data: file, but files names no sample for input {spec.name!r}")
    path = (directory / relative).resolve()
    if not path.is_relative_to(directory.resolve()) or not path.is_file():
        raise refuse(f"files: {relative!r} for input {spec.name!r} is not a file inside {directory}")
    if spec.datatype == "BYTES":
        if shape != [1] and shape != []:
            raise refuse(f"input {spec.name!r}: a sample file is one element; its shape is {shape}")
        one = np.empty(len(shape) * (1,), dtype=object)
        one[...] = path.read_bytes()
        return one
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any failure to read is the file's
        raise refuse(f"files: {relative!r} is not a .npy array: {type(exc).__name__}: {exc}") from None
    if array.dtype != DATATYPES[spec.datatype] or len(array.shape) != len(shape) or any(
            s not in (-1, a) for a, s in zip(array.shape, shape)):
        raise refuse(f"files: {relative!r} holds {array.dtype} {list(array.shape)}; input {spec.name!r} takes "
                     f"{spec.datatype} {shape} (one example, without the batch dimension)")
    return array
