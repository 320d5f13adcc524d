"""The ABPS methods, for the runtime's method registry.

Declared as the ``abps`` plugin of the entry-point group ``abps.methods`` (pyproject.toml), which
:func:`federation.methods.registry.all_methods` loads on first use (ABPS sits above the runtime,
so the runtime never names it); importing :mod:`abps.method` runs the
``@register`` decorators of :class:`abps.method.AbpsMethod` and its presets
(:data:`abps.method.PRESETS`), so ``abps train --method abps-x`` finds them.
"""

from __future__ import annotations

from abps.method import PRESETS

__all__ = ["PRESETS"]
