"""Analytical performance and cost simulator for transformer pre-training.

    >>> import simulator
    >>> plan = simulator.simulate("pythia-1b", "8x3090")
    >>> plan.days, plan.strategy
"""

from .api import run_search, search, simulate
from .errors import UsageError
from .models import ModelSpec, get_model, list_models
from .plan import Plan

__all__ = ["simulate", "search", "run_search", "Plan", "ModelSpec", "get_model", "list_models", "UsageError"]
__version__ = "0.1.0"
