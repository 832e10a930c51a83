"""serving (being built)."""
