"""Federations as stacked tensors: cohorts, synthetic cohorts, drift scenarios, image federations;
:mod:`federation.data.load` is the one place that picks a loader."""
