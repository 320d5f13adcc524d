"""Stacked trainers of every center at once: the clinical MLP, the SAGE image model, the C++ kernels,
mixing of stacked parameters; :mod:`federation.engine.build` picks the engine of a federation."""
