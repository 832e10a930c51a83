"""What a training job calls: its model's answers on the training set, as a reference.

The job has the model and the data in memory; the server never runs the model. The arrays
are sketched here, in the job's process, and only the sketches are sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shamal.client import ShamalClient

__all__ = ["upload_predictions"]


def upload_predictions(
    model: str,
    version: int,
    columns: Mapping[str, Any],
    *,
    role: str = "prediction",
    client: ShamalClient | None = None,
) -> dict[str, Any]:
    """Sketch ``columns`` (arrays by column name: ``{"score": model.predict_proba(x)[:, 1]}``)
    and add the sketches to the reference profile of ``model``'s ``version``. Numbers are
    sketched as numeric columns, text and booleans as categorical.

    Args:
        model, version: the registered model version (its reference is built first, from
            its training dataset version: ``shamal monitor reference build``).
        columns: the model's answers (or, with ``role="feature"``, inputs) by column.
        role: ``prediction`` (default) or ``feature``.
        client: the API client (default: one from ``SHAMAL_URL`` and ``SHAMAL_TOKEN``, as a
            job has them).

    Returns:
        The reference profile as the server now holds it.
    """
    from shamal.monitoring.core import SketchBuilder  # numpy, scipy, pyarrow: on use

    builder = SketchBuilder()
    builder.update(dict(columns))
    sketches = {name: sketch.to_json() for name, sketch in builder.result().items()}
    if client is not None:
        return client.upload_sketches(model, version, sketches, role=role)
    with ShamalClient() as own:
        return own.upload_sketches(model, version, sketches, role=role)
