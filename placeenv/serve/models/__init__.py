"""Servable models behind a Triton-python-backend-like contract (see ``placeenv.serve.models.base``).

Import after ``placeenv.sim.prepare()`` when using simulated devices: this imports Paddle.
"""

from . import registry
from .base import InputError, Model
from .registry import available, create, describe

__all__ = ["InputError", "Model", "available", "create", "describe", "registry"]
