"""Experiment tracking: experiments, runs, params, metrics, tags, datasets, logged models."""

from __future__ import annotations

from shamal.tracking._service import TrackingService

__all__ = ["TrackingService"]
