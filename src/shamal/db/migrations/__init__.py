"""The schema migrations Alembic runs (``shamal db upgrade``); run through :mod:`shamal.db`."""

__all__: list[str] = []
