"""The bundled repository's examples, built reproducibly.

- ``digits``: an MLP trained on scikit-learn's 8x8 digits (``train_digits.py``),
  saved with ``paddle.jit.save`` and committed, with a ``model.py`` for
  its JSON-friendly pre- and post-processing.
- ``mobilenet``: MobileNetV2 (scale 0.5, 10 classes, 3x32x32) with seeded random
  weights, a plain ``jit.save`` directory. Not committed: built at first start into
  the per-user cache (``mobilenet_home()``), since an installed package may be
  read-only; ``python -m placeenv.serve.models.examples [REPOSITORY]`` builds it
  there, or into ``REPOSITORY/mobilenet/1`` for a repository of your own.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import paddle

from placeenv import PlaceEnv
from placeenv.sim import user_cache

MOBILENET_SEED = 0
MOBILENET_INPUT = paddle.static.InputSpec([None, 3, 32, 32], "float32", name="image")
DIGITS_INPUT = paddle.static.InputSpec([None, 64], "float32", name="pixels")


def mobilenet_network() -> paddle.nn.Layer:
    """MobileNetV2, its weights drawn from a fixed seed (every build is the same model)."""
    network = paddle.vision.models.mobilenet_v2(num_classes=10, scale=0.5)
    # Our own numpy generator, not Paddle's: state_dict order is fixed, so the draws are too.
    rng = np.random.default_rng(MOBILENET_SEED)
    missing, unexpected = network.set_state_dict(
        {name: _seeded(rng, value.numpy()) for name, value in network.state_dict().items()}
    )
    assert not missing and not unexpected, (missing, unexpected)
    network.eval()
    return network


def _seeded(rng: np.random.Generator, value: np.ndarray) -> np.ndarray:
    if value.ndim == 4:  # conv [out, in/groups, kh, kw]: Kaiming normal on the fan-in
        std = math.sqrt(2.0 / math.prod(value.shape[1:]))
        return rng.normal(0.0, std, value.shape).astype(np.float32)
    if value.ndim == 2:  # classifier [in, out]: Xavier uniform
        limit = math.sqrt(6.0 / sum(value.shape))
        return rng.uniform(-limit, limit, value.shape).astype(np.float32)
    return value  # biases and BatchNorm scale/shift/statistics start as constants


@PlaceEnv("cpu")
def save(network: paddle.nn.Layer, version_dir: Path, spec) -> None:
    """``paddle.jit.save`` into ``version_dir/model.*``, atomically: a half-written program is never seen."""
    version_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=version_dir.parent))
    try:
        paddle.jit.save(network, str(staging / "model"), input_spec=[spec])
        version_dir.mkdir(exist_ok=True)
        # The program last: a reader that sees model.json finds its parameters already there.
        for name in ("model.pdiparams", "model.json"):
            os.replace(staging / name, version_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def cache_root() -> Path:
    """The per-user cache the built examples go to, beside the sim plugin's."""
    return user_cache() / "examples"


def mobilenet_home() -> Path:
    """Where the bundled mobilenet's version directories are built, keyed by this file and Paddle's
    version: a changed example, or another Paddle, builds anew instead of serving a stale program."""
    digest = hashlib.sha256(Path(__file__).read_bytes() + paddle.__version__.encode()).hexdigest()[:16]
    return cache_root() / f"mobilenet-{digest}"


def ensure_mobilenet(repository: Path | None = None) -> bool:
    """Build mobilenet's version 1 unless it is there (in ``mobilenet_home()``, or
    ``<repository>/mobilenet/1`` when given); whether it built."""
    version_dir = mobilenet_home() / "1" if repository is None else repository / "mobilenet" / "1"
    if (version_dir / "model.json").is_file() and (version_dir / "model.pdiparams").is_file():
        return False
    with PlaceEnv("cpu"):
        save(mobilenet_network(), version_dir, MOBILENET_INPUT)
    return True


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    built = ensure_mobilenet(target)
    where = mobilenet_home() / "1" if target is None else target / "mobilenet" / "1"
    print(f"{where}: {'built' if built else 'already there'}")
