"""Tracking in the MLflow REST dialect."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
