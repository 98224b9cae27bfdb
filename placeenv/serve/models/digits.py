"""Handwritten digits: an MLP trained on scikit-learn's bundled 8x8 digits (see train_digits.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import paddle

from .base import Model, labelled, softmax

WEIGHTS = Path(__file__).with_name("weights") / "digits.pdparams"
PIXEL_MAX = 16.0  # load_digits pixels are integers 0..16
HIDDEN = 128


def build_network() -> paddle.nn.Layer:
    """64 -> 128 -> 10; shared with the training script so the weight names match."""
    return paddle.nn.Sequential(
        paddle.nn.Linear(64, HIDDEN),
        paddle.nn.ReLU(),
        paddle.nn.Linear(HIDDEN, 10),
    )


def split_digits():
    """(X_train, X_test, y_train, y_test): the fixed split used for training and for tests.

    X is raw pixels, float32 [n, 64] in 0..16; y is int64. Needs scikit-learn (a dev dependency).
    """
    from sklearn.datasets import load_digits  # imported here: serving does not need sklearn
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x, y = x.astype(np.float32), y.astype(np.int64)
    return train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)


def held_out_split() -> tuple[np.ndarray, np.ndarray]:
    """(X_test, y_test): the examples training never saw."""
    _, x_test, _, y_test = split_digits()
    return x_test, y_test


class Digits(Model):
    name = "digits"
    description = (
        "Handwritten digit classifier (MLP 64-128-10) trained on scikit-learn's 8x8 digits; "
        "pixels 0..16, 64 values flat or 8x8 nested."
    )
    input_shape = (64,)
    accepted_shapes = ((64,), (8, 8))
    value_range = (0.0, PIXEL_MAX)
    output = '{"label": int 0..9, "probabilities": [10 floats summing to 1]}'

    def build(self) -> paddle.nn.Layer:
        network = build_network()
        # Host arrays: set_state_dict copies them into the parameters, which already live on the place.
        state = paddle.load(str(WEIGHTS), return_numpy=True)
        missing, unexpected = network.set_state_dict(state)
        if missing or unexpected:
            raise RuntimeError(f"{WEIGHTS}: missing {missing}, unexpected {unexpected}")
        return network

    def normalise(self, batch: np.ndarray) -> np.ndarray:
        return batch / np.float32(PIXEL_MAX)

    def postprocess(self, outputs: paddle.Tensor) -> list[dict[str, Any]]:
        return labelled(softmax(outputs), "probabilities")
