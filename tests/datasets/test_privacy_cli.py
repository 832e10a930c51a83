"""`shamal data privacy / reveal / erase / erasures / rotate-privacy-key` and `shamal user grant`
against a real server process."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from shamal.cli import app
from shamal.client import ShamalClient
from tests.live import LiveServer

pytestmark = pytest.mark.slow

Shamal = Callable[..., tuple[int, str]]

SOURCE = (
    "id,email,phone,name\n"
    "1,amal.secret@example.ae,+971501234567,Zaynab Qasimi\n"
    "2,badr@example.ae,+971509999999,Omar\n"
    "3,amal.secret@example.ae,+971501234567,Zaynab Qasimi\n"
)
POLICY = """
version: 1
columns:
  email: {action: hmac, purpose: crm}
  phone: {action: tokenize, purpose: support}
  name: drop
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("privacy-home")) as live:
        with ShamalClient(live.url, live.token) as api:
            api.create_team("analytics")
        yield live


@pytest.fixture
def shamal(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Shamal:
    monkeypatch.setenv("SHAMAL_URL", server.url)
    runner = CliRunner()

    def run(*args: str, token: str = server.token, stdin: str | None = None) -> tuple[int, str]:
        result = runner.invoke(
            app, list(args), env={"COLUMNS": "160", "SHAMAL_TOKEN": token}, input=stdin
        )
        return result.exit_code, result.output

    return run


def test_privacy_policy_reveal_and_erase(
    shamal: Shamal, server: LiveServer, tmp_path: Path
) -> None:
    source = tmp_path / "people.csv"
    source.write_text(SOURCE)
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY + "retention: 30d\n")
    good = tmp_path / "policy.yaml"
    good.write_text(POLICY)
    assert shamal("data", "create", "people", "--team", "analytics")[0] == 0
    code, out = shamal("data", "privacy", "people", "--file", str(bad))
    assert code == 1
    assert "unknown key 'retention'" in out
    assert "Traceback" not in out
    code, out = shamal("data", "privacy", "people")
    assert "has no privacy policy" in out
    code, out = shamal("data", "privacy", "people", "--file", str(good))
    assert code == 0, out
    code, out = shamal("data", "privacy", "people")
    assert "tokenize" in out
    code, out = shamal("data", "ingest", "people", "--from", str(source), "--json")
    assert code == 0, out
    version = json.loads(out)
    assert [c["name"] for c in version["columns"]] == ["id", "email", "phone"]
    assert shamal("data", "download", "people", "--to", str(tmp_path / "v1"))[0] == 0
    (part,) = (tmp_path / "v1").glob("*.parquet")
    phones = pq.read_table(part).column("phone").to_pylist()
    assert "+971" not in "".join(phones)

    dpo = _reveal_as_officer(shamal, server, phones)

    # Erasure, the subject read from stdin (not left in the shell's history).
    code, out = shamal(
        "data", "erase", "people", "--subject", "-", "--column", "email",
        stdin="amal.secret@example.ae\n",
    )  # fmt: skip
    assert code == 0, out
    assert "removed 2 row(s)" in out
    code, out = shamal("data", "erasures", "people", "--json")
    assert [e["rows_removed"] for e in json.loads(out)] == [2]
    assert "amal" not in out
    assert shamal("data", "download", "people/1", "--to", str(tmp_path / "after"))[0] == 0
    read = pa.concat_tables([pq.read_table(p) for p in (tmp_path / "after").glob("*.parquet")])
    assert read.column("id").to_pylist() == [2]
    code, out = shamal("user", "revoke", "privacy-officer", "dpo")
    assert code == 0, out
    code, out = shamal("data", "reveal", "people", phones[1], "--column", "phone", token=dpo)
    assert code == 1


def _reveal_as_officer(shamal: Shamal, server: LiveServer, phones: list[str]) -> str:
    """Only a privacy officer reveals; a platform admin gives the grant. The officer's token."""
    code, out = shamal("data", "reveal", "people", phones[0], "--column", "phone")
    assert code == 1
    assert "privacy-officer" in out
    assert shamal("user", "create", "dpo")[0] == 0
    code, out = shamal("user", "grant", "privacy-officer", "dpo")
    assert code == 0, out
    code, out = shamal("user", "grant", "superpowers", "dpo")
    assert code == 1
    assert "unknown grant" in out
    with ShamalClient(server.url, server.token) as api:
        dpo = api.create_token("t", user="dpo")["secret"]
    code, out = shamal("data", "rotate-privacy-key")
    assert code == 0, out
    code, out = shamal(
        "data", "reveal", "people", phones[0], phones[1], "--column", "phone", "--json", token=dpo
    )
    assert code == 0, out
    assert json.loads(out) == {phones[0]: "+971501234567", phones[1]: "+971509999999"}

    return dpo
