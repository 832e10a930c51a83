"""Monitoring: drift, data quality and performance of deployed models, closing the loop.

The pure statistics live in :mod:`shamal.monitoring.core`; monitors, their results and the
actions they take (events, retraining, rollback) are built on it here.
"""

from __future__ import annotations

__all__: list[str] = []
