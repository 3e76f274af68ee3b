"""Client for the stand-in's event-publishing admin API (see `emission.py`).

events = SesEventsAdmin("http://127.0.0.1:4579")
sub = events.subscribe("http://127.0.0.1:8080/sns", TOPIC, configuration_sets=["marketing"])
events.wait_confirmed(sub["id"])
events.set_rates(configuration_set="marketing", p_bounce=0.02, p_complaint=0.003)
events.wait_drained()
bounced = events.feedback(campaign="42")["addresses"].get("bounce", [])
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from infra.ses_standin.admin import SesStandinAdmin


def lost(state: Mapping[str, Any]) -> dict[str, int]:
    """What the stand-in has given up on since it started, read from a `subscriptions()`
    state: `dropped` (its queue for the emitter was full) and `overflow` (the emitter's was)."""
    return {k: int(state.get(k) or 0) for k in ("overflow", "dropped")}


class SesEventsAdmin(SesStandinAdmin):
    def subscribe(
        self,
        endpoint: str,
        topic_arn: str,
        *,
        configuration_sets: Sequence[str] | None = None,
        event_types: Sequence[str] | None = None,
        signature_version: int = 1,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "endpoint": endpoint,
            "topic_arn": topic_arn,
            "configuration_sets": list(configuration_sets) if configuration_sets else None,
            "event_types": list(event_types) if event_types else None,
            "signature_version": signature_version,
        }
        return cast(dict[str, Any], self._call("POST", "/_admin/subscriptions", body=body))

    def subscriptions(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call("GET", "/_admin/subscriptions"))

    def subscription(self, sub_id: str) -> dict[str, Any] | None:
        for sub in self.subscriptions()["subscriptions"]:
            if sub["id"] == sub_id:
                return cast(dict[str, Any], sub)
        return None

    def unsubscribe(self, sub_id: str) -> None:
        self._call("DELETE", f"/_admin/subscriptions/{sub_id}")

    def wait_confirmed(self, sub_id: str, timeout: float = 20.0) -> dict[str, Any]:
        """Until the endpoint has confirmed (GET of its SubscribeURL); TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            sub = self.subscription(sub_id)
            if sub is not None and sub["status"] == "confirmed":
                return sub
            if time.monotonic() > deadline:
                raise TimeoutError(f"subscription {sub_id} not confirmed: {sub}")
            time.sleep(0.05)

    def wait_drained(self, timeout: float = 60.0, quiet_s: float = 0.6) -> dict[str, Any]:
        """Until nothing is buffered, signing, in flight or waiting for a retry (and has stayed
        so for `quiet_s`, covering the emitter's half-second statistics)."""
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        while True:
            state = self.subscriptions()
            now = time.monotonic()
            if state["pending"] == 0:
                quiet_since = quiet_since or now
                if now - quiet_since >= quiet_s:
                    return state
            else:
                quiet_since = None
            if now > deadline:
                raise TimeoutError(f"event emission not drained: pending={state['pending']}")
            time.sleep(0.1)

    def firehose(self) -> dict[str, Any]:
        """The Firehose event destinations in force and each delivery stream's statistics
        (delivered_records, delivered_requests, retried_requests, dropped_records, …)."""
        return cast(dict[str, Any], self._call("GET", "/_admin/firehose"))

    def rates(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call("GET", "/_admin/feedback/rates"))

    def set_rates(self, configuration_set: str | None = None, **rates: float | str) -> None:
        body: dict[str, Any] = dict(rates)
        if configuration_set:
            body["configuration_set"] = configuration_set
        self._call("POST", "/_admin/feedback/rates", body=body)

    def clear_rates(self, configuration_set: str) -> None:
        self._call(
            "POST",
            "/_admin/feedback/rates",
            body={"configuration_set": configuration_set, "clear": True},
        )

    def feedback(self, campaign: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._call("GET", "/_admin/feedback", {"campaign": campaign}))

    def set_engagement(
        self, template: str | None = None, *, p_open: float = 0.0, p_click: float = 0.0
    ) -> dict[str, Any]:
        """Open/click shares for messages of `template` (None: every other template); the
        campaign's `feedback` counts them under `open:<template>` and `click:<template>`."""
        body = {"template": template, "p_open": p_open, "p_click": p_click}
        return cast(dict[str, Any], self._call("POST", "/_admin/feedback/engagement", body=body))
