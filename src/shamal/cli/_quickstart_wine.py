"""What the quickstart and its loop share: the team, the model and the dataset they name,
scikit-learn's wine data as a lab's CSV export, and where the served model answers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MEASURED_FROM",
    "MODEL",
    "QUICKSTART_TEAM",
    "SERVED_AS",
    "TRAINING_DATA",
    "Served",
    "taster",
    "wine_csv",
    "wine_measurements",
]

QUICKSTART_TEAM = "quickstart"
#: The registered model the quickstart trains, serves and retrains.
MODEL = "quickstart-wine"

#: The quickstart's training data as a dataset.
TRAINING_DATA = "wine"

#: When the lab measured the samples: one an hour, the last an hour before this instant.
MEASURED_FROM = "2026-06-01T00:00:00+00:00"


def wine_measurements() -> list[str]:
    """The 13 measurements' names, as feature names (letters, digits and '_')."""
    from sklearn.datasets import load_wine

    return [name.replace("/", "_") for name in load_wine().feature_names]


def wine_csv(folder: Path) -> Path:
    """scikit-learn's wine data as the CSV a lab would export: each sample's id and when it
    was measured, its 13 measurements, the class, and who tasted it (made up, but personal:
    it is pseudonymized at ingestion)."""
    import csv
    from datetime import datetime, timedelta

    from sklearn.datasets import load_wine

    wine = load_wine()
    start = datetime.fromisoformat(MEASURED_FROM)
    path = folder / "wine.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sample_id", "measured_at", *wine_measurements(), "target", "taster"])
        for index, (row, label) in enumerate(zip(wine.data, wine.target, strict=True)):
            when = (start + timedelta(hours=index)).isoformat()
            writer.writerow(
                [index, when, *(repr(float(v)) for v in row), int(label), taster(index)]
            )
    return path


def taster(index: int) -> str:
    return f"taster{index % 7}@winery.example"


SERVED_AS = "wine"


@dataclass(frozen=True, slots=True)
class Served:
    """Where the quickstart's `shamal serve` answers, and its callers' token."""

    http_port: int
    caller: str
