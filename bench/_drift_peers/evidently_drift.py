"""Evidently's side of bench/drift.py, run by the peer venv's interpreter (bench/.evidently-venv).

``--task big``: both Parquet files read by pandas, then ``Report([DataDriftPreset()],
include_tests=True)`` on datasets whose ``DataDefinition`` names the numeric and categorical
columns: Evidently's default test per column, its default thresholds and its dataset rule.
Timed from the first byte read to the snapshot's dictionary. ``--task cases``: the same on
each pair of the agreement cases. Writes the per-column test, statistic and verdict (the
column's ``Value Drift`` test fails when Evidently calls drift) as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
from evidently import DataDefinition, Dataset, Report
from evidently.presets import DataDriftPreset

#: Evidently's display names of its tests -> the names both sides print.
TESTS = {
    "K-S p_value": "ks",
    "chi-square p_value": "chisquare",
    "Z-test p_value": "z",
    "Wasserstein distance (normed)": "wasserstein",
    "Jensen-Shannon distance": "jensenshannon",
    "PSI": "psi",
}


def drift(
    reference: pd.DataFrame, current: pd.DataFrame, specs: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    definition = DataDefinition(
        numerical_columns=[s["name"] for s in specs if s["kind"] == "numeric"],
        categorical_columns=[s["name"] for s in specs if s["kind"] == "categorical"],
    )
    snapshot = Report([DataDriftPreset()], include_tests=True).run(
        Dataset.from_pandas(current, data_definition=definition),
        Dataset.from_pandas(reference, data_definition=definition),
    )
    raw = snapshot.dict()
    columns: dict[str, dict[str, Any]] = {}
    for metric in raw["metrics"]:
        config = metric["config"]
        if config.get("type") == "evidently:metric_v2:ValueDrift":
            columns[config["column"]] = {
                "test": TESTS.get(config["method"], config["method"]),
                "statistic": float(metric["value"]),
            }
    for test in raw["tests"]:
        params = test["metric_config"]["params"]
        if params.get("type") == "evidently:metric_v2:ValueDrift":
            columns[params["column"]]["drifted"] = test["status"] == "FAIL"
    return columns


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=("big", "cases"), required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # Evidently's and pandas' deprecation chatter
    if args.task == "big":
        specs = json.loads((args.folder / "big.json").read_text())
        started = time.perf_counter()
        reference = pd.read_parquet(args.folder / "big_ref.parquet")
        current = pd.read_parquet(args.folder / "big_cur.parquet")
        columns = drift(reference, current, specs)
        result: dict[str, Any] = {"work_s": time.perf_counter() - started, "columns": columns}
    else:
        result = {"pairs": []}
        for pair in json.loads((args.folder / "cases.json").read_text()):
            name = f"case{pair['pair']:02}"
            reference = pd.read_parquet(args.folder / f"{name}_ref.parquet")
            current = pd.read_parquet(args.folder / f"{name}_cur.parquet")
            result["pairs"].append(drift(reference, current, pair["columns"]))
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
