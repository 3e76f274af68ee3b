"""Client for the stand-in's SQS event publishing (see `sqs_sink.py`).

sqs = SqsSinkAdmin("http://127.0.0.1:4579")
sub = sqs.subscribe(QUEUE_URL, TOPIC, configuration_sets=["marketing"])
sqs.wait_drained()
bounced = sqs.feedback(campaign="42")["addresses"].get("bounce", [])
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

from infra.ses_standin.admin import SesStandinAdmin

PATH = "/_admin/sqs-subscriptions"


class SqsSinkAdmin(SesStandinAdmin):
    def subscribe(
        self,
        queue_url: str,
        topic_arn: str,
        *,
        configuration_sets: Sequence[str] | None = None,
        event_types: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "queue_url": queue_url,
            "topic_arn": topic_arn,
            "configuration_sets": list(configuration_sets) if configuration_sets else None,
            "event_types": list(event_types) if event_types else None,
        }
        return cast(dict[str, Any], self._call("POST", PATH, body=body))

    def state(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call("GET", PATH))

    def subscription(self, sub_id: str) -> dict[str, Any] | None:
        for sub in self.state()["subscriptions"]:
            if sub["id"] == sub_id:
                return cast(dict[str, Any], sub)
        return None

    def unsubscribe(self, sub_id: str) -> None:
        self._call("DELETE", f"{PATH}/{sub_id}")

    def wait_drained(self, timeout: float = 60.0, quiet_s: float = 0.6) -> dict[str, Any]:
        """Until every planned event is in SQS (nothing buffered, in flight or waiting for a
        retry) and has stayed so for `quiet_s` (the child reports twice a second)."""
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        while True:
            state = self.state()
            now = time.monotonic()
            if state["pending"] == 0:
                quiet_since = quiet_since or now
                if now - quiet_since >= quiet_s:
                    return state
            else:
                quiet_since = None
            if now > deadline:
                raise TimeoutError(f"SQS emission not drained: pending={state['pending']}")
            time.sleep(0.1)

    def feedback(self, campaign: str) -> dict[str, Any]:
        return cast(
            dict[str, Any], self._call("GET", "/_admin/sqs-feedback", {"campaign": campaign})
        )
