"""Train the digits MLP reproducibly on CPU and write placeenv/serve/models/weights/digits.pdparams.

Run ``python -m placeenv.serve.models.train_digits`` (with an editable install: the file
lands in the repository).
"""

from __future__ import annotations

import numpy as np
import paddle

from placeenv import PlaceEnv

from .digits import PIXEL_MAX, WEIGHTS, build_network, split_digits

SEED = 0
EPOCHS = 60
BATCH = 32
LEARNING_RATE = 1e-3


def accuracy(network: paddle.nn.Layer, x: np.ndarray, y: np.ndarray) -> float:
    with paddle.no_grad():
        logits = network(paddle.to_tensor(x / PIXEL_MAX))
    return float((logits.numpy().argmax(axis=1) == y).mean())


@PlaceEnv("cpu")
def train() -> float:
    """Train, save the weights, return held-out accuracy."""
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
    WEIGHTS.parent.mkdir(exist_ok=True)
    paddle.save(network.state_dict(), str(WEIGHTS))
    return accuracy(network, x_test, y_test)


if __name__ == "__main__":
    held_out = train()
    print(f"held-out accuracy {held_out:.4f}; wrote {WEIGHTS} ({WEIGHTS.stat().st_size} bytes)")
