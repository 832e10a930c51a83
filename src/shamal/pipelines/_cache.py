"""Step cache keys (pure): what a step's result depends on, hashed part by part so that a
miss can say which part changed.

The key covers the step's code (the pipeline version's code snapshot and the function or
command it runs), every argument as the step receives it (dataset references resolved to
version numbers, upstream outputs by value), and its environment (its own variables, the
platform's Python and Shamal versions). Resources, retries, time limits and the executor
(local or Ray) are not part of it: they change how and where a step runs, never what it
computes, so a result made on one executor is reused on the other.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CacheKey", "cache_key", "explain_miss"]


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheKey:
    """The key and the digest of each part it was made of."""

    key: str
    parts: Mapping[str, Any]


def cache_key(
    *,
    snapshot: str | None,
    target: str,
    args: Mapping[str, Any],
    env: Mapping[str, str],
    environment: Mapping[str, str],
) -> CacheKey:
    """The key of one step about to run.

    Args:
        snapshot: the code snapshot's digest (None: no code folder).
        target: ``file.py:function`` or the command, as text.
        args: the arguments exactly as the step will get them.
        env: the step's own environment variables.
        environment: what the platform runs it with (Python, Shamal, image).
    """
    parts: dict[str, Any] = {
        "code": _digest({"snapshot": snapshot, "target": target}),
        "args": {name: _digest(value) for name, value in sorted(args.items())},
        "environment": _digest({"env": dict(env), "platform": dict(environment)}),
    }
    return CacheKey(_digest(parts), parts)


def explain_miss(previous: Mapping[str, Any] | None, current: Mapping[str, Any]) -> str:
    """Why a step's result could not be reused, against the parts of its last cached
    result (None: it never had one)."""
    if previous is None:
        return "no earlier result of this step"
    changed = []
    if previous.get("code") != current.get("code"):
        changed.append("its code changed")
    before: Mapping[str, Any] = previous.get("args") or {}
    now: Mapping[str, Any] = current.get("args") or {}
    args = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if args:
        changed.append(f"arguments changed: {', '.join(args[:8])}")
    if previous.get("environment") != current.get("environment"):
        changed.append("its environment changed")
    return "; ".join(changed) or "the result was not kept"
