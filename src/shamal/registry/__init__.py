"""Model registry: registered models, versions, aliases, tags, lineage to runs."""
