"""The request path's tensor shortcuts give the answers of the slow ways they replace: ``host_tensor``
is ``paddle.to_tensor`` on the CPU, ``host_view`` the same over the array's own memory, ``move_to`` is
``Tensor.to``, ``placeenv.device_name`` follows a place object that changes, and the path a worker takes
with a request leaks no Python objects.
"""

from __future__ import annotations

import gc

import numpy as np
import paddle
import pytest

import placeenv
from placeenv import PlaceEnv
from placeenv.serve.models import BUNDLED, scan
from placeenv.serve.models.base import batch_tensor, host_tensor, host_view, move_to


def test_device_name_cache_follows_a_place_object_that_changes():
    place = type(paddle.ones([1]).place)()  # the generic place type Tensor.place returns
    place.set_place(paddle.CPUPlace())
    assert placeenv.device_name(place) == "cpu"
    place.set_place(paddle.CustomPlace("sim", 1))  # the cache keyed a copy, not this object
    assert placeenv.device_name(place) == "sim:1"
    assert placeenv.device_name(paddle.CustomPlace("sim", 3)) == "sim:3"
    assert placeenv.device_name(paddle.CPUPlace()) == "cpu"


def _objects_left_after(step, n: int = 300) -> int:
    """How many more GC-tracked objects exist after ``n`` calls of ``step`` (results dropped)."""
    for _ in range(20):
        step()
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(n):
        step()
    gc.collect()
    return len(gc.get_objects()) - before


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_host_tensor_is_to_tensor_on_cpu(dtype):
    array = (np.arange(24).reshape(2, 3, 4) * 1.5).astype(dtype)
    ours, stock = host_tensor(array), paddle.to_tensor(array, place=paddle.CPUPlace())
    assert (ours.dtype, ours.shape, ours.stop_gradient, placeenv.device_name(ours.place)) == (
        stock.dtype, stock.shape, stock.stop_gradient, "cpu"
    )
    assert np.array_equal(ours.numpy(), stock.numpy())
    array[0, 0, 0] = 99  # a copy, not a view of the caller's array
    assert ours.numpy()[0, 0, 0] == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int64", "int32", "uint8", "bool"])
def test_host_view_is_to_tensor_on_cpu_over_the_arrays_memory(dtype):
    """What a batch's host arrays become (batch_tensor): the request's own memory, so that the move to a
    device is its one copy."""
    array = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
    ours, stock = host_view(array), paddle.to_tensor(array, place=paddle.CPUPlace())
    assert (ours.dtype, ours.shape, ours.stop_gradient, placeenv.device_name(ours.place)) == (
        stock.dtype, stock.shape, stock.stop_gradient, "cpu")
    assert np.array_equal(ours.numpy(), stock.numpy())
    assert np.array_equal(move_to(ours, placeenv.to_place("sim:2")).numpy(), array)
    joined = batch_tensor([array])
    array[0, 0, 0] = 1  # a view: the tensors read the array's memory (the control: host_tensor's copy does not)
    assert ours.numpy()[0, 0, 0] == joined.numpy()[0, 0, 0] == 1 and stock.numpy()[0, 0, 0] == 0
    del array
    assert ours.numpy().shape == (2, 3, 4)  # the view keeps the array alive
    strided = np.arange(24, dtype="float32").reshape(4, 6)[:, ::2]  # not contiguous: made so first, its shape kept
    assert np.array_equal(host_view(strided).numpy(), strided)
    # A body's bytes (read-only): a batch's tensor copies them, so that no execute writes into a request's body.
    body = bytes(np.arange(6, dtype="float32").tobytes())
    frozen = np.frombuffer(body, "float32").reshape(2, 3)
    copied = batch_tensor([frozen])
    copied[0, 0] = 7.0
    assert frozen[0, 0] == 0.0 and np.array_equal(copied.numpy()[1], frozen[1])
    writable = frozen.copy()
    viewed = batch_tensor([writable])  # the control: a request's own array is viewed, not copied
    viewed[0, 0] = 7.0
    assert writable[0, 0] == 7.0


@pytest.mark.parametrize("device", ["sim:2", "cpu"])
@pytest.mark.parametrize("stop_gradient", [True, False])
def test_move_to_is_tensor_to(device, stop_gradient):
    source = host_tensor(np.arange(12, dtype="float32").reshape(3, 4))
    source.stop_gradient = stop_gradient
    place = placeenv.to_place(device)
    ours, stock = move_to(source, place), source.to(place)
    assert (placeenv.device_name(ours.place), ours.dtype, ours.shape, ours.stop_gradient) == (
        placeenv.device_name(stock.place), stock.dtype, stock.shape, stock.stop_gradient
    ) == (device, source.dtype, source.shape, stop_gradient)
    assert np.array_equal(ours.numpy(), source.numpy())


def test_the_request_path_leaks_no_python_objects():
    """Paddle 3.3.1's eager Tensor constructor leaks a list per call; the request path avoids it."""
    entries, errors = scan([BUNDLED], ["digits"], max_batch_size=8, max_batch_delay_ms=2.0)
    assert errors == []
    version = entries["digits"].default
    model = version.model_class()
    model.initialize(placeenv.to_place("sim:1"), version.context)
    example = np.array([[float(i % 17) for i in range(64)]], dtype="float32")
    arrays = [np.full((1, 64), 3.0, dtype="float32") for _ in range(3)]
    jobs = [host_tensor(array) for array in arrays]

    def request():  # what the service and a worker do with one request, and with a batch of three
        with PlaceEnv("cpu"):
            host = host_tensor(model.preprocess({"pixels": example})["pixels"])
        model.postprocess(model.execute({"pixels": move_to(host, model.place)}))
        model.postprocess(model.execute({"pixels": move_to(batch_tensor([example]), model.place)}))
        model.postprocess(model.execute({"pixels": move_to(paddle.concat(jobs), model.place)}))

    assert _objects_left_after(request) < 30
    # The negative control: the same count catches the leak host_tensor avoids.
    assert _objects_left_after(lambda: paddle.to_tensor(arrays[0], place=paddle.CPUPlace())) >= 300
