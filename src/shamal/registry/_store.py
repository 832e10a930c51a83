"""_store of the registry domain."""

from __future__ import annotations
