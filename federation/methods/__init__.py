"""Federated methods and their registry (``abps train --method NAME``)."""

from federation.methods.base import Context, Method, NoParams, RoundPlan
from federation.methods.baselines import BASELINES
from federation.methods.registry import METHODS, get_method, register_method

for _cls in BASELINES:
    register_method(_cls.name, _cls)

__all__ = ["Context", "Method", "NoParams", "RoundPlan", "METHODS", "get_method", "register_method"]
