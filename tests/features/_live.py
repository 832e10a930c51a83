"""A live server with one team's dataset, as the feature store's end-to-end tests start it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shamal.client import ShamalClient
from tests.live import LiveServer


@contextmanager
def server_with_dataset(
    home: Path, team: str, dataset: str, rows: pa.Table
) -> Iterator[tuple[LiveServer, ShamalClient]]:
    """A server process in ``home`` where ``team`` owns ``dataset``, ingested from ``rows``
    (as a Parquet upload); a client of it with the admin token."""
    with LiveServer(home) as live, ShamalClient(live.url, live.token) as api:
        api.create_team(team)
        api.create_dataset(dataset, team=team)
        source = home.parent / f"{home.name}-{dataset}.parquet"
        pq.write_table(rows, source)
        api.ingest_file(dataset, source)
        yield live, api
