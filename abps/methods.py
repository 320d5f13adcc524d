"""The ABPS methods, for the runtime's method registry.

:func:`federation.methods.registry.get_method` imports this module on first use (ABPS sits above
the runtime, so the runtime cannot import it eagerly); importing :mod:`abps.method` runs the
``@register`` decorators of :class:`abps.method.AbpsMethod` and its presets
(:data:`abps.method.PRESETS`), so ``abps train --method abps-x`` finds them.
"""

from __future__ import annotations

from abps.method import PRESETS

__all__ = ["PRESETS"]
