"""optimize (being built)."""
