"""Analytical performance and cost simulator for pre-training: transformers (decoders, encoders,
ViT), mixtures of experts, Mamba and ConvNeXt.

    >>> import simulator
    >>> plan = simulator.simulate("pythia-1b", "8x3090")
    >>> plan.days, plan.strategy
"""

from .answer.api import run_search, search, simulate
from .answer.plan import Plan
from .core.errors import UsageError
from .model.presets import get_model, list_models
from .model.spec import ModelSpec

__all__ = ["simulate", "search", "run_search", "Plan", "ModelSpec", "get_model", "list_models", "UsageError"]
__version__ = "0.1.0"
