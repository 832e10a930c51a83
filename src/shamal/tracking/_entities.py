"""_entities of the tracking domain."""

from __future__ import annotations
