"""The fixed set of servable models. Names map to classes in code only: nothing is loaded by name."""

from __future__ import annotations

from typing import Any

from .base import Model
from .digits import Digits
from .faulty import Faulty
from .mobilenet import MobileNet

_MODELS: dict[str, type[Model]] = {cls.name: cls for cls in (Digits, MobileNet, Faulty)}


def available() -> list[str]:
    return sorted(_MODELS)


def create(name: str) -> Model:
    """A new, uninitialised replica of model ``name``; ``KeyError`` lists the available names."""
    # isinstance first: a JSON name may be a list or dict, which cannot be a dict key.
    if not isinstance(name, str) or name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; available: {', '.join(available())}")
    return _MODELS[name]()


def describe() -> list[dict[str, Any]]:
    return [_MODELS[name].describe() for name in available()]
