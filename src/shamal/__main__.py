"""`python -m shamal` is the `shamal` command."""

from __future__ import annotations

from shamal.cli import main

main()
