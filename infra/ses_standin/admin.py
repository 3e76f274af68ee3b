"""Client for the stand-in's `/_admin/` API (stdlib urllib only, usable from any test).

admin = SesStandinAdmin("http://127.0.0.1:4579")
admin.wait_ready(10)
admin.set_faults(p_transient=0.1, max_send_rate=200)
assert admin.stats(campaign="42")["duplicates"] == 0
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TypedDict, cast


class Stats(TypedDict):
    campaign: str | None
    accepted: int  # recipients accepted
    messages: int  # messages accepted (one per bulk entry)
    duplicates: int  # extra copies of (campaign, destination) pairs
    duplicate_destinations: list[str]  # first 100
    max_1s_window: int  # most recipients accepted in any sliding 1 s window
    first_ts: float | None
    last_ts: float | None
    rendering_failures: int
    promo_codes: int  # distinct promo codes accepted (template data `promo_code`)
    promo_code_destinations: int  # destinations that got one
    promo_code_recipients: int  # accepted recipients whose mail carried a code
    promo_code_conflicts: int  # messages carrying a code seen at another address, or a 2nd code
    promo_code_conflict_list: list[str]  # first 100
    hung_calls: int  # process-wide: calls accepted and never answered
    hung_recipients: int
    now: float  # the stand-in's clock (epoch seconds) when it answered


class Faults(TypedDict):
    latency_ms: float
    jitter_ms: float
    p429: float
    p_transient: float
    p_hang: float
    max_send_rate: float
    max_24h_send: float
    sending_enabled: bool
    hang_max_s: float
    refuse_addresses: str
    sms_mps: float
    sms_monthly_spend_usd: float


class AdminError(Exception):
    """The stand-in's admin API refused a request."""


class SesStandinAdmin:
    """Typed wrapper over `/_admin/*` of one running stand-in."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def health(self) -> bool:
        return bool(self._call("GET", "/_admin/health").get("ok"))

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Poll `health` until it answers; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if self.health():
                    return
            except (OSError, AdminError) as exc:
                last = exc
            time.sleep(0.05)
        raise TimeoutError(f"SES stand-in at {self.base_url} not ready: {last}")

    def stats(self, campaign: str | None = None) -> Stats:
        return cast(Stats, self._call("GET", "/_admin/stats", {"campaign": campaign}))

    def rate(self, campaign: str | None = None, bucket_ms: int = 1000) -> list[tuple[float, int]]:
        rows = self._call("GET", "/_admin/rate", {"campaign": campaign, "bucket_ms": bucket_ms})
        return [(float(t), int(n)) for t, n in rows]

    def messages(
        self,
        campaign: str | None = None,
        destination: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        query = {"campaign": campaign, "destination": destination, "limit": limit}
        return cast(list[dict[str, Any]], self._call("GET", "/_admin/messages", query))

    def sms_stats(self, campaign: str | None = None) -> dict[str, Any]:
        """SMS (pinpoint-sms-voice-v2) figures: accepted, duplicates (extra messages to one
        number), max_1s_window (messages), max_1s_window_segments, segments, first_ts,
        last_ts; without a campaign also spent_usd and throttled."""
        return cast(dict[str, Any], self._call("GET", "/_admin/sms/stats", {"campaign": campaign}))

    def sms_messages(
        self, destination: str | None = None, campaign: str | None = None
    ) -> list[dict[str, Any]]:
        query = {"destination": destination, "campaign": campaign}
        return cast(list[dict[str, Any]], self._call("GET", "/_admin/sms/messages", query))

    def sms_inbound(self, origin: str, body: str, to: str = "") -> dict[str, Any]:
        """A recipient's reply: `STOP` (or another opt-out keyword) opts `origin` out."""
        payload = {"from": origin, "body": body, "to": to}
        return cast(dict[str, Any], self._call("POST", "/_admin/sms/inbound", body=payload))

    def sms_reset(self) -> None:
        self._call("POST", "/_admin/sms/reset")

    def push_stats(self, campaign: str | None = None) -> dict[str, Any]:
        """Mobile push (SNS Publish to endpoints) figures: accepted, duplicates (publishes to
        one endpoint beyond its first), max_1s_window; without a campaign also throttled."""
        return cast(dict[str, Any], self._call("GET", "/_admin/push/stats", {"campaign": campaign}))

    def push_messages(
        self, endpoint: str | None = None, campaign: str | None = None
    ) -> list[dict[str, Any]]:
        query = {"endpoint": endpoint, "campaign": campaign}
        return cast(list[dict[str, Any]], self._call("GET", "/_admin/push/messages", query))

    def push_invalidate(self, token: str) -> dict[str, Any]:
        """The platform now reports `token` invalid (its next publish fails, SNS disables it)."""
        return cast(
            dict[str, Any], self._call("POST", "/_admin/push/invalidate", body={"token": token})
        )

    def push_register(self, application_arn: str, tokens: list[str]) -> list[str]:
        """Many CreatePlatformEndpoint at once (the lab's seeding): the ARNs, in order."""
        body = {"application": application_arn, "tokens": tokens}
        answer = self._call("POST", "/_admin/push/endpoints", body=body)
        return [str(a) for a in answer["endpoint_arns"]]

    def faults(self) -> Faults:
        return cast(Faults, self._call("GET", "/_admin/faults"))

    def set_faults(self, **changes: float | bool | str) -> Faults:
        return cast(Faults, self._call("POST", "/_admin/faults", body=changes))

    def reset(self, templates: bool = False) -> None:
        self._call("POST", "/_admin/reset", {"templates": 1 if templates else None})

    def ensure_template(self, name: str, subject: str, text: str = "", html: str = "") -> None:
        """Create or overwrite a template through the SES API itself (test convenience)."""
        content = {"Subject": subject, **({"Text": text} if text else {})}
        if html:
            content["Html"] = html
        try:
            self._call(
                "POST",
                "/v2/email/templates",
                body={"TemplateName": name, "TemplateContent": content},
            )
        except AdminError as exc:
            if "AlreadyExists" not in str(exc):
                raise
            path = f"/v2/email/templates/{urllib.parse.quote(name)}"
            self._call("PUT", path, body={"TemplateContent": content})

    def _call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        url = self.base_url + path
        params = {k: v for k, v in (query or {}).items() if v is not None}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            error_type = exc.headers.get("x-amzn-ErrorType", "")
            raise AdminError(f"{method} {path}: HTTP {exc.code} {error_type} {detail}") from None
