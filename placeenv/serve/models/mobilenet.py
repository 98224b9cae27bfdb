"""MobileNetV2 (scale 0.5, 10 classes) on 3x32x32 inputs, random weights from a fixed seed: a load model."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import paddle

from .base import Model, labelled, softmax

SEED = 0


def build_network() -> paddle.nn.Layer:
    return paddle.vision.models.mobilenet_v2(num_classes=10, scale=0.5)


def seeded(rng: np.random.Generator, value: np.ndarray) -> np.ndarray:
    """A fresh draw for one weight, or ``value`` itself when it is a constant.

    Drawn from our own numpy generator, not Paddle's: Paddle's RNG is one per
    process (sim and CPU draws share it), so replicas initialised concurrently
    in worker threads would interleave draws even after ``paddle.seed``.
    """
    if value.ndim == 4:  # conv [out, in/groups, kh, kw]: Kaiming normal on the fan-in
        std = math.sqrt(2.0 / math.prod(value.shape[1:]))
        return rng.normal(0.0, std, value.shape).astype(np.float32)
    if value.ndim == 2:  # classifier [in, out]: Xavier uniform
        limit = math.sqrt(6.0 / sum(value.shape))
        return rng.uniform(-limit, limit, value.shape).astype(np.float32)
    return value  # biases and BatchNorm scale/shift/statistics start as constants


class MobileNet(Model):
    name = "mobilenet"
    description = (
        "MobileNetV2 (scale 0.5, 10 classes) on 3x32x32 inputs. Random weights, fixed seed: "
        "for load, not accuracy; its labels mean nothing."
    )
    input_shape = (3, 32, 32)
    accepted_shapes = ((3, 32, 32),)
    # Bounded so float32 activations, and so the JSON scores, stay finite.
    value_range = (-1e3, 1e3)
    output = '{"label": int 0..9, "scores": [10 softmax floats]}'

    def build(self) -> paddle.nn.Layer:
        network = build_network()
        rng = np.random.default_rng(SEED)  # state_dict order is fixed, so every replica draws the same
        missing, unexpected = network.set_state_dict(
            {name: seeded(rng, value.numpy()) for name, value in network.state_dict().items()}
        )
        if missing or unexpected:
            raise RuntimeError(f"mobilenet: missing {missing}, unexpected {unexpected}")
        return network

    def postprocess(self, outputs: paddle.Tensor) -> list[dict[str, Any]]:
        return labelled(softmax(outputs), "scores")
