"""The Ray token a local head needs is made once, atomically, and never replaced."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shamal.executors import ensure_ray_token


@pytest.fixture(autouse=True)
def _no_ray_auth_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)


def test_concurrent_heads_share_one_private_token(tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: ensure_ray_token(tmp_path), range(32)))
    token = tmp_path / ".ray" / "auth_token"
    assert set(paths) == {token}
    text = token.read_text()
    assert len(text) == 64
    assert set(text) <= set("0123456789abcdef")
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert [p.name for p in token.parent.iterdir()] == ["auth_token"]  # no partial files left


def test_an_existing_token_is_never_replaced(tmp_path: Path) -> None:
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("the operator's token")
    assert ensure_ray_token(tmp_path) == token
    assert token.read_text() == "the operator's token"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RAY_AUTH_MODE", "disabled"),
        ("RAY_AUTH_TOKEN", "abc"),
        ("RAY_AUTH_TOKEN_PATH", "/somewhere/else"),
    ],
)
def test_no_file_where_ray_is_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    assert ensure_ray_token(tmp_path) is None
    assert not (tmp_path / ".ray").exists()
