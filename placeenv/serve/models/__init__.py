"""The model contract and the model repository (see ``base`` and ``repository``).

A ``model.py`` in a repository writes ``from placeenv.serve.models import Model, InputError, TensorSpec``.
Import after ``placeenv.sim.prepare()`` when using simulated devices: this imports Paddle.
"""

from ..protocol.wire import DATATYPES
from .base import InputError, Model, ModelContext, TensorSpec
from .repository import BUNDLED, Entry, ModelConfig, RepositoryError, scan

__all__ = ["BUNDLED", "DATATYPES", "Entry", "InputError", "Model", "ModelConfig", "ModelContext",
           "RepositoryError", "TensorSpec", "scan"]
