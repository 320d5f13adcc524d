"""Federated methods and their registry (``abps train --method NAME``).

Importing this package registers the runtime's own methods (baselines, decentralized, BNN+FL, the SAGE
selectors; each class carries ``@register``); :mod:`federation.methods.registry` loads the
ABPS methods on the first lookup.
"""

from federation.methods import baselines, bnn, decentralized, sage_selector  # noqa: F401,E402  (each registers its classes)
from federation.methods.base import Context, Method, NoParams, RoundPlan
from federation.methods.registry import (
                                         METHODS,
                                         all_methods,
                                         display_names,
                                         families,
                                         get_method,
                                         method_names,
                                         paper_order,
                                         register,
)

__all__ = ["Context", "Method", "NoParams", "RoundPlan", "METHODS", "all_methods", "display_names", "families",
           "get_method", "method_names", "paper_order", "register"]
