"""Shared by the web UI's tests: signing a client in through the form, as a browser does."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

CSRF = re.compile(r'name="csrf" value="([^"]*)"')


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found is not None, "the page has no form token"
    return found.group(1)


def sign_in(client: TestClient, token: str, **fields: str) -> object:
    """Post the sign-in form with its own form token; the answer (a 303 when it worked)."""
    form = client.get("/ui/sign-in")
    assert form.status_code == 200
    data = {"token": token, "csrf": csrf_of(form.text), **fields}
    return client.post("/ui/sign-in", data=data, follow_redirects=False)


@pytest.fixture
def browser(api: TestClient) -> Iterator[TestClient]:
    """A client with no bearer header: only the UI's cookie may sign it in."""
    with TestClient(api.app, raise_server_exceptions=False, follow_redirects=False) as client:
        yield client


def screenshot(browser: Any, folder: Path, name: str) -> Path:
    """A screenshot of the page as it is, saved in ``folder`` (and in the README's folder
    when ``UI_SCREENSHOTS`` names it: ``docs/screenshots``)."""
    path = folder / f"{name}.png"
    assert browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000  # a drawn page, not an empty one
    wanted = os.environ.get("UI_SCREENSHOTS")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(wanted) / path.name)
    return path
