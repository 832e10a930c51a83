"""Experiment tracking: experiments, runs, params, metrics, tags, datasets, logged models."""
