"""Shamal: a self-hostable ML platform."""

__version__ = "0.1.0"
