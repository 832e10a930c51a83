"""The registry in the MLflow REST dialect (filled in by the registry work)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
