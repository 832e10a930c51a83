"""deployments (being built)."""
