"""Templates, static files and the headers every page carries."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.responses import HTMLResponse, RedirectResponse, Response

#: No inline script or style, nothing from elsewhere: a value that slipped past escaping
#: still cannot run.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_STATIC_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}


def _when(ms: int | None) -> str:
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(start_ms: int | None, end_ms: int | None) -> str:
    if not start_ms or not end_ms or end_ms < start_ms:
        return ""
    seconds = (end_ms - start_ms) // 1000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _number(value: float) -> str:
    return f"{value:.6g}"


def _query(values: dict[str, Any]) -> str:
    """A query string of ``values`` (lists repeat their key; None and "" are left out),
    percent-encoded: user text only ever reaches a link as an encoded query value."""
    pairs: list[tuple[str, str]] = []
    for key, value in values.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            if item is not None and item != "":
                pairs.append((key, str(item)))
    return "?" + urlencode(pairs) if pairs else ""


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("shamal.webui", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["number"] = _number
    env.globals["duration"] = _duration
    env.globals["query"] = _query
    return env


_ENV = _environment()


def page(
    template: str,
    context: dict[str, Any],
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    """``template`` rendered with ``context`` (autoescaped), with the security headers."""
    body = _ENV.get_template(template).render(**context)
    return HTMLResponse(
        body, status_code=status_code, headers={**SECURITY_HEADERS, **(headers or {})}
    )


def fragment(template: str, context: dict[str, Any], *, final: bool = False) -> HTMLResponse:
    """A part of a page, for ``live.js`` to put in place (``data-live``): ``template``
    rendered without the page around it. ``final`` tells the script to stop following (the
    job finished, the rollout ended)."""
    body = _ENV.get_template(template).render(**context)
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-store"}
    if final:
        headers["X-Shamal-Final"] = "1"
    return HTMLResponse(body, headers=headers)


def redirect(path: str) -> RedirectResponse:
    """A 303 to ``path``, one of the UI's own (never a path taken from user data)."""
    return RedirectResponse(path, status_code=303, headers=SECURITY_HEADERS)


def _load_static() -> dict[str, tuple[bytes, str]]:
    files: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files("shamal.webui").joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _STATIC_TYPES:
            files[entry.name] = (entry.read_bytes(), _STATIC_TYPES[suffix])
    return files


#: Read once: a fixed set of names, so a request names a file and never a path.
STATIC_FILES = _load_static()


def static_file(name: str) -> Response | None:
    """The packaged static file ``name``, or None when there is no such file."""
    found = STATIC_FILES.get(name)
    if found is None:
        return None
    body, media_type = found
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-cache"}
    return Response(body, media_type=media_type, headers=headers)
