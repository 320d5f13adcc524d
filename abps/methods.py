"""Registers the ABPS presets with the runtime's method registry.

:func:`federation.methods.registry.get_method` imports this module on first use, so
``abps train --method abps-x`` (or any name in :data:`abps.method.PRESETS`) finds them.
"""

from __future__ import annotations

from abps.method import PRESETS
from federation.methods.registry import register_method

for _name, _cls in PRESETS.items():
    register_method(_name, _cls)

__all__ = ["PRESETS"]
