"""Shamal: a self-hostable ML platform."""

__all__ = ["__version__"]

__version__ = "0.1.0"
