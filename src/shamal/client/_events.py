"""Client calls of the event stream and webhooks (``shamal events``, ``shamal webhooks``).

Answers are the server's JSON (see ``shamal.events.api``): an event has ``id``, ``kind``,
``subject``, ``team``, ``actor``, ``payload``, ``created_at``; a webhook ``id``, ``name``,
``team``, ``url``, ``filter``, ``active``, ...; its secret comes only with its creation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from shamal.client._calls import ClientCalls


def _hook_path(webhook_id: str) -> str:
    return f"/api/v1/webhooks/{quote(webhook_id, safe='')}"


class EventCalls(ClientCalls):
    """Calls of the events and webhooks API."""

    def events(
        self,
        *,
        after: int = 0,
        kinds: Sequence[str] = (),
        where: str | None = None,
        limit: int = 100,
    ) -> dict[str, Any]:
        """A page of the events after ``after`` you may see, oldest first, of ``kinds`` (all
        when empty) passing the filter condition ``where``: ``{"events", "next_after"}``."""
        params: dict[str, Any] = {"after": after, "limit": limit}
        if kinds:
            params["kind"] = list(kinds)
        if where:
            params["where"] = where
        page: dict[str, Any] = self.request("GET", "/api/v1/events", params=params)
        return page

    def create_webhook(
        self,
        name: str,
        url: str,
        events_filter: str,
        *,
        team: str | None = None,
        secret: str | None = None,
    ) -> dict[str, Any]:
        """Make a webhook; the answer carries its ``secret``, shown this once."""
        body: dict[str, Any] = {"name": name, "url": url, "filter": events_filter}
        if team is not None:
            body["team"] = team
        if secret is not None:
            body["secret"] = secret
        made: dict[str, Any] = self.request("POST", "/api/v1/webhooks", json=body)
        return made

    def webhooks(self) -> list[dict[str, Any]]:
        """The webhooks of the teams you maintain (admins: all)."""
        found: dict[str, Any] = self.request("GET", "/api/v1/webhooks")
        hooks: list[dict[str, Any]] = found["webhooks"]
        return hooks

    def webhook(self, webhook_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.request("GET", _hook_path(webhook_id))
        return found

    def webhook_deliveries(self, webhook_id: str, *, limit: int = 100) -> list[dict[str, Any]]:
        """The webhook's delivery log, newest attempt first."""
        found: dict[str, Any] = self.request(
            "GET", _hook_path(webhook_id) + "/deliveries", params={"limit": limit}
        )
        deliveries: list[dict[str, Any]] = found["deliveries"]
        return deliveries

    def set_webhook_active(self, webhook_id: str, active: bool) -> dict[str, Any]:
        """Pause (False) or resume (True) the webhook."""
        hook: dict[str, Any] = self.request(
            "PUT", _hook_path(webhook_id) + "/active", json={"active": active}
        )
        return hook

    def delete_webhook(self, webhook_id: str) -> None:
        self.request("DELETE", _hook_path(webhook_id))
