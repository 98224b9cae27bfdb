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
import sys
import warnings

__all__ = [
    "PlaceEnv",
    "ScopeError",
    "UnsupportedPaddleError",
    "aio",
    "available_devices",
    "bind",
    "current_place",
    "device_name",
    "install",
    "installed",
    "prepare_devices",
    "to_place",
    "uninstall",
]

# Every name is loaded on first use, and none of these modules imports Paddle
# when it loads: so any of them works before `import paddle`, after it, and
# after placeenv.sim.prepare().
_LAZY = {
    "aio": None,
    "PlaceEnv": "placeenv.env",
    "ScopeError": "placeenv.state",
    "bind": "placeenv.env",
    "current_place": "placeenv.env",
    "install": "placeenv.patch",
    "installed": "placeenv.patch",
    "prepare_devices": "placeenv.patch",
    "uninstall": "placeenv.patch",
    "available_devices": "placeenv.places",
    "device_name": "placeenv.places",
    "to_place": "placeenv.places",
    "UnsupportedPaddleError": "placeenv._internals",
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
        spec = None
        for finder in sys.meta_path:  # the finders after this one, as the import system would ask them
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module):
            with _no_ccache_warning():
                exec_module(module)
            _disarm()
            patch = importlib.import_module("placeenv.patch")
            try:
                patch.install()
            except importlib.import_module("placeenv._internals").UnsupportedPaddleError as error:
                # `import paddle` itself must keep working; placeenv's own API raises the error.
                warnings.warn(f"placeenv is not installed: {error}", RuntimeWarning, stacklevel=2)

        spec.loader.exec_module = exec_then_install
        return spec


class _no_ccache_warning:
    """Hides Paddle's "No ccache found" UserWarning while the hook imports Paddle: it concerns building
    C++ extensions, not placeenv's users. Only this one filter is added and then removed, so filters
    set meanwhile (Paddle's own import adds some) stay, which ``warnings.catch_warnings`` would undo."""

    def __enter__(self) -> None:
        warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning,
                                module=r"paddle\.utils\.cpp_extension\.")
        self.entry = warnings.filters[0]

    def __exit__(self, *exc) -> None:
        if self.entry in warnings.filters:
            warnings.filters.remove(self.entry)


def _disarm() -> None:
    """Stop ``import paddle`` from installing placeenv (it was installed, or uninstall() was asked)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _InstallAfterPaddleImport)]


if "paddle" in sys.modules:
    importlib.import_module("placeenv.patch").install()
elif not any(isinstance(f, _InstallAfterPaddleImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _InstallAfterPaddleImport())
