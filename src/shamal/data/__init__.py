"""The data SDK: read a dataset version where your code runs, and record that you read it.

``shamal.data.load("customers")`` is the latest valid version of ``customers`` as an Arrow table
(``customers@prod`` and ``customers/3`` name others; ``.to_pandas()`` is a call away), and
:func:`batches` streams it batch by batch for training loops. When a run is active (the
``run_id`` given, else ``MLFLOW_RUN_ID``, as a job's environment or ``mlflow.start_run`` sets
it), the version read is logged as the run's input, as MLflow's ``log_input`` does: its
``source`` is the version's ``data:/NAME/N`` URI and its digest the version's, so a run's
lineage starts at the exact data it read.

With the stock MLflow client, ``mlflow.log_input(shamal.data.mlflow_dataset("customers@prod"))``
logs the same input (the same source, digest and columns), so lineage links that run to the
same version.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shamal.client import ShamalClient

__all__ = ["SOURCE_TYPE", "batches", "load", "log_read", "mlflow_dataset", "version"]

#: The ``source_type`` of a Shamal dataset in a run's inputs.
SOURCE_TYPE = "shamal"


def version(reference: str, *, client: ShamalClient | None = None) -> dict[str, Any]:
    """The version ``reference`` names (``NAME``, ``NAME/3``, ``NAME@alias``), as the API
    describes it: ``uri``, ``digest``, ``row_count``, ``columns``, ``parts``..."""
    if client is not None:
        return client.dataset_version(reference)
    with ShamalClient() as own:
        return own.dataset_version(reference)


def mlflow_dataset(reference: str, *, client: ShamalClient | None = None) -> Any:
    """The version ``reference`` names (``NAME``, ``NAME/3``, ``NAME@alias``) as an MLflow
    dataset (an ``mlflow.data.dataset.Dataset``), for ``mlflow.log_input``: its source is
    the concrete version's ``data:/NAME/N`` (an alias is resolved now), its digest the
    version's. Needs MLflow installed; registers the ``shamal`` source type with it, so
    ``mlflow.data.from_pandas(df, source="data:/NAME/N")`` resolves too.

    Raises:
        NotFound: no such dataset, version or alias.
    """
    from mlflow.data.dataset_source_registry import get_registered_sources, register_dataset_source

    from shamal.data._mlflow import ShamalDataset, ShamalDatasetSource

    known: list[Any] = list(get_registered_sources())  # classes, whatever MLflow's hints say
    if ShamalDatasetSource not in known:
        source_class: Any = ShamalDatasetSource
        register_dataset_source(source_class)
    return ShamalDataset(version(reference, client=client))


def _active_run(run_id: str | None) -> str | None:
    if run_id:
        return run_id
    if os.environ.get("MLFLOW_RUN_ID"):
        return os.environ["MLFLOW_RUN_ID"]
    mlflow = sys.modules.get("mlflow")  # never imported here: only asked when already loaded
    if mlflow is not None:
        active = mlflow.active_run()
        if active is not None:
            return str(active.info.run_id)
    return None


def log_read(client: ShamalClient, run_id: str, found: dict[str, Any]) -> None:
    """Record on run ``run_id`` that it read the version ``found`` (a run input)."""
    dataset = {
        "name": found["dataset"],
        "digest": found["digest"],
        "source_type": SOURCE_TYPE,
        "source": json.dumps({"uri": found["uri"]}),
        "schema": json.dumps({"columns": found["columns"]}),
    }
    body = {
        "run_id": run_id,
        "datasets": [
            {"dataset": dataset, "tags": [{"key": "mlflow.data.context", "value": "training"}]}
        ],
    }
    client.request("POST", "/api/2.0/mlflow/runs/log-inputs", json=body)


def _parts(client: ShamalClient, found: dict[str, Any], folder: Path) -> Iterator[Path]:
    for index in range(len(found["parts"])):
        target = folder / f"part-{index:05d}.parquet"
        client.download_dataset_part(found["dataset"], found["version"], index, target)
        yield target


def batches(
    reference: str,
    *,
    batch_size: int = 65_536,
    run_id: str | None = None,
    client: ShamalClient | None = None,
) -> Iterator[pa.RecordBatch]:
    """The version's rows as Arrow record batches of at most ``batch_size`` rows, one part
    downloaded at a time (the read is logged on the active run first, as :func:`load` does)."""
    own = client is None
    api = client or ShamalClient()
    try:
        found = api.dataset_version(reference)
        run = _active_run(run_id)
        if run is not None:
            log_read(api, run, found)
        with tempfile.TemporaryDirectory(prefix="shamal-data-") as tmp:
            for path in _parts(api, found, Path(tmp)):
                yield from pq.ParquetFile(path).iter_batches(batch_size=batch_size)
                path.unlink()
    finally:
        if own:
            api.close()


def load(
    reference: str, *, run_id: str | None = None, client: ShamalClient | None = None
) -> pa.Table:
    """The version ``reference`` names, whole, as an Arrow table (``.to_pandas()`` for a
    DataFrame); the read is logged on the active run.

    Raises:
        NotFound: no such dataset, version or alias, or no valid version yet.
    """
    # Every version holds rows (an ingestion of none is refused), so there is a first batch.
    return pa.Table.from_batches(list(batches(reference, run_id=run_id, client=client)))
