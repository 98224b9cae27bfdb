"""Per-thread and per-task devices for stock PaddlePaddle.

``import placeenv`` installs into Paddle (now, or as soon as Paddle is
imported, so ``placeenv.sim.prepare()`` can still run before ``import
paddle``). After that:

* ``paddle.set_device`` on the main thread behaves as in stock Paddle; in any
  other thread it changes that thread only;
* a thread that never set a device follows the main thread's current device;
* ``PlaceEnv(device)`` scopes a block, a function, a coroutine or a generator
  to a device, per thread and per asyncio task.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

__all__ = [
    "PlaceEnv",
    "aio",
    "available_devices",
    "bind",
    "current_place",
    "device_name",
    "install",
    "installed",
    "to_place",
    "uninstall",
]

_LAZY = {
    "aio": None,
    "PlaceEnv": "placeenv.env",
    "bind": "placeenv.env",
    "current_place": "placeenv.env",
    "install": "placeenv.patch",
    "installed": "placeenv.patch",
    "uninstall": "placeenv.patch",
    "available_devices": "placeenv.places",
    "device_name": "placeenv.places",
    "to_place": "placeenv.places",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'placeenv' has no attribute {name!r}")
    module = _LAZY[name]
    value = importlib.import_module(f"placeenv.{name}") if module is None else getattr(
        importlib.import_module(module), name
    )
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


class _InstallAfterPaddleImport(importlib.abc.MetaPathFinder):
    """Runs ``install()`` right after ``import paddle`` completes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "paddle":
            return None
        # PathFinder directly: importlib.util.find_spec would come back here.
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            importlib.import_module("placeenv.patch").install()

        spec.loader.exec_module = exec_then_install
        return spec


if "paddle" in sys.modules:
    importlib.import_module("placeenv.patch").install()
elif not any(isinstance(f, _InstallAfterPaddleImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _InstallAfterPaddleImport())
