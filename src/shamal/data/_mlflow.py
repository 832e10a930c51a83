"""A Shamal dataset version as the stock MLflow client's ``mlflow.data`` objects.

Loaded only when asked for (``shamal.data.mlflow_dataset``): MLflow is not a dependency of
Shamal. What ``mlflow.log_input`` sends for these objects is what :func:`shamal.data.log_read`
sends (source type ``shamal``, source ``{"uri": "data:/NAME/N"}``, the version's digest and
columns), so the server links a run to the same version whichever way it was logged.
"""

from __future__ import annotations

import json
from typing import Any

from mlflow.data.dataset import Dataset
from mlflow.data.dataset_source import DatasetSource

from shamal.client import ShamalClient

SOURCE_TYPE = "shamal"


class ShamalDatasetSource(DatasetSource):
    """Where a run's rows came from: one Shamal dataset version, ``data:/NAME/N``.

    Registered with MLflow's dataset source registry, it also resolves a ``data:/...`` string
    given as a source (``mlflow.data.from_pandas(df, source="data:/customers@prod")``) to the
    concrete version it names now."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    @staticmethod
    def _get_source_type() -> str:
        return SOURCE_TYPE

    def load(self) -> Any:
        """The version's rows, as an Arrow table (``shamal.data.load``)."""
        from shamal.data import load

        return load(self.uri)

    @staticmethod
    def _can_resolve(raw_source: Any) -> bool:
        return isinstance(raw_source, str) and raw_source.startswith("data:/")

    @classmethod
    def _resolve(cls, raw_source: Any) -> ShamalDatasetSource:
        with ShamalClient() as api:
            return cls(str(api.dataset_version(str(raw_source))["uri"]))

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri}

    @classmethod
    def from_dict(cls, source_dict: dict[Any, Any]) -> ShamalDatasetSource:
        return cls(str(source_dict["uri"]))


class ShamalDataset(Dataset):
    """A dataset version as ``mlflow.log_input`` takes it: named, digested and described
    by the version itself (nothing is computed from rows on the client)."""

    def __init__(self, found: dict[str, Any]) -> None:
        self._columns = list(found["columns"])
        super().__init__(
            source=ShamalDatasetSource(str(found["uri"])),
            name=str(found["dataset"]),
            digest=str(found["digest"]),
        )

    def _compute_digest(self) -> str:  # never called: the version's digest is given
        raise NotImplementedError

    @property
    def profile(self) -> Any | None:
        return None

    @property
    def schema(self) -> Any | None:
        return {"columns": self._columns}

    def to_dict(self) -> dict[str, str]:
        config: dict[str, str] = super().to_dict()
        config["schema"] = json.dumps({"columns": self._columns})
        return config
