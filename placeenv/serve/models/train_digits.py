"""Train the digits MLP reproducibly on CPU and save it into the bundled repository (digits/1/model.*).

Run ``python -m placeenv.serve.models.train_digits`` (with an editable install the
program lands in the checkout). Needs scikit-learn (a dev dependency).
"""

from __future__ import annotations

import numpy as np
import paddle

from placeenv import PlaceEnv

from ..config import BUNDLED
from .examples import DIGITS_INPUT, save

VERSION_DIR = BUNDLED / "digits" / "1"
PIXEL_MAX = 16.0  # load_digits pixels are integers 0..16
HIDDEN = 128
SEED = 0
EPOCHS = 60
BATCH = 32
LEARNING_RATE = 1e-3


def build_network() -> paddle.nn.Layer:
    """64 -> 128 -> 10, on the pixels scaled to [0, 1] (digits/1/model.py scales them)."""
    return paddle.nn.Sequential(paddle.nn.Linear(64, HIDDEN), paddle.nn.ReLU(), paddle.nn.Linear(HIDDEN, 10))


def split_digits():
    """(X_train, X_test, y_train, y_test): the fixed split used for training and for tests.

    X is raw pixels, float32 [n, 64] in 0..16; y is int64.
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


def accuracy(network: paddle.nn.Layer, x: np.ndarray, y: np.ndarray) -> float:
    with paddle.no_grad():
        logits = network(paddle.to_tensor(x / PIXEL_MAX))
    return float((logits.numpy().argmax(axis=1) == y).mean())


@PlaceEnv("cpu")
def train() -> float:
    """Train, save the program, return held-out accuracy."""
    paddle.seed(SEED)
    shuffle = np.random.default_rng(SEED)
    x_train, x_test, y_train, y_test = split_digits()
    network = build_network()
    optimizer = paddle.optimizer.Adam(learning_rate=LEARNING_RATE, parameters=network.parameters())
    loss_fn = paddle.nn.CrossEntropyLoss()
    for _ in range(EPOCHS):
        order = shuffle.permutation(len(x_train))
        for start in range(0, len(order), BATCH):
            batch = order[start : start + BATCH]
            logits = network(paddle.to_tensor(x_train[batch] / PIXEL_MAX))
            loss = loss_fn(logits, paddle.to_tensor(y_train[batch]))
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
    network.eval()
    save(network, VERSION_DIR, DIGITS_INPUT)
    return accuracy(network, x_test, y_test)


if __name__ == "__main__":
    held_out = train()
    print(f"held-out accuracy {held_out:.4f}; wrote {VERSION_DIR}")
