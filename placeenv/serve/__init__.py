"""Multi-device Paddle inference service built on placeenv (see ``python -m placeenv.serve --help``).

The library (``pip install placeenv``) does not bring the service stack; this
subpackage needs the ``service`` extra: ``pip install 'placeenv[service]'``.
Importing it without the extra raises an ImportError that says so, instead of
a bare ModuleNotFoundError from deep inside the service.
"""

from __future__ import annotations

import importlib.util

# Top-level modules the service imports at run time (distributions of the `service` extra).
_SERVICE_STACK = {
    "fastapi": "fastapi",
    "uvicorn": "uvicorn[standard]",
    "pydantic": "pydantic",  # with pydantic_core, which pydantic pins
    "pydantic_settings": "pydantic-settings",
    "prometheus_client": "prometheus-client",
    "yaml": "pyyaml",
    "fastapi_offline": "fastapi-offline",
    "msgspec": "msgspec",
    "zmq": "pyzmq",
}


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return True


_absent = [dist for module, dist in _SERVICE_STACK.items() if _missing(module)]
if _absent:
    raise ImportError(
        f"placeenv.serve (the inference service) needs {', '.join(_absent)}, which the library install "
        "does not bring: pip install 'placeenv[service]'",
        name=__name__,
    )
del _absent
