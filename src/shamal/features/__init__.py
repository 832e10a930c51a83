"""Features: entities, feature views over dataset versions, feature services, point-in-time
correct training sets and an online store.

Being built (issue 21); the modules land one by one.
"""

from __future__ import annotations

__all__: list[str] = []
