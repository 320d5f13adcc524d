"""Image benchmarks: SAGE optimal-stopping peer selection on Fashion-MNIST and CIFAR-10.

Public entry point: :func:`cli_run` (``federation.images.cli_run``
= ``federation.images.run.cli_run``). See docs/sage.md.
"""

from federation.images.run import cli_run

__all__ = ["cli_run"]
