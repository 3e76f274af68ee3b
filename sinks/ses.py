"""SES adapter: the only module that talks to boto3. botocore errors never leave it.

The client is created with SDK retries OFF: SES has no idempotency key, so a retried
SendBulkEmail after a read timeout could send the whole batch twice. We decide retries
ourselves (streams.rules.outcomes). Parameter validation is off too (it costs ~30 % of the client's
CPU per call); we validate entries ourselves (≤ 50 per call, tag characters).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from flashsend.errors import FlashsendError
from flashsend.settings import Settings
from sinks.aws_client import provider_client
from sinks.ses_body import MAX_REPLACEMENT_HEADERS, BulkEntry, EncodedEntries

__all__ = [
    "MAX_BULK_ENTRIES",
    "MAX_REPLACEMENT_HEADERS",
    "BulkEntry",
    "CallClock",
    "EntryStatus",
    "SesCallFailed",
    "SesSender",
    "check_tag",
    "make_client",
]

MAX_BULK_ENTRIES = 50
_TAG = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


class SesCallFailed(FlashsendError):
    """The SES call did not return per-entry results."""

    def __init__(
        self, code: str | None, http_status: int | None, *, timed_out: bool, message: str = ""
    ) -> None:
        super().__init__(f"SES call failed: {code or 'no response'} ({http_status}) {message}")
        self.code = code
        self.http_status = http_status
        self.timed_out = timed_out
        self.message = message  # SES's own words (e.g. which address it refused)
        # time.monotonic() when SES's error answer arrived; None when no answer came back
        self.answered_at: float | None = None


@dataclass(frozen=True)
class EntryStatus:
    status: str
    message_id: str | None
    error: str | None


def check_tag(name: str, value: str) -> None:
    if not _TAG.match(name) or not _TAG.match(value):
        raise ValueError(f"SES tag {name}={value!r} must match [A-Za-z0-9_-]{{1,256}}")


def make_client(
    settings: Settings, *, timeout: float | None = None, pool: int | None = None
) -> Any:
    """One client per worker: clients are thread-safe; size the pool to the calls in flight."""
    return provider_client(
        settings,
        "sesv2",
        timeout_s=timeout or settings.ses_timeout_s,
        pool=pool or max(10, settings.inflight_calls * 2),
    )


# botocore's rest-json serializer walks the service model for every value it sends: for a
# 50-entry SendBulkEmail that walk was 12 % of a worker's CPU (py-spy, docs/decisions.md).
# For this operation the walk is an identity copy (only strings, lists and structures, no
# renamed or header-bound members, attachments aside: tests/unit/test_ses_body.py checks the
# model and compares the bytes with botocore's), and the body is `json.dumps` of the
# parameters, exactly as botocore writes it. So send_bulk writes the entries as JSON text
# (sinks.ses_body), the hook below writes the rest of the body around them and takes the
# entries out of the walk, and the body is put back before the request is signed. Both
# events are botocore's public extension points. Entries given as dicts (a direct
# `send_bulk_email` call) are left to botocore.
_PREBUILT_BODY = "flashsend_prebuilt_body"
_HOOKS = (
    ("before-parameter-build.sesv2.SendBulkEmail", "flashsend-prebuild-bulk-body"),
    ("before-call.sesv2.SendBulkEmail", "flashsend-restore-bulk-body"),
    ("before-send.sesv2.SendBulkEmail", "flashsend-gate-bulk-send"),
    ("before-parse.sesv2.SendBulkEmail", "flashsend-note-bulk-answer"),
)


def _prebuild_bulk_body(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    entries = params.get("BulkEmailEntries")
    if not isinstance(entries, EncodedEntries):
        return
    del params["BulkEmailEntries"]  # re-added last: the dump below ends with its empty list
    params["BulkEmailEntries"] = []
    head = json.dumps(params)
    context[_PREBUILT_BODY] = (head[:-2] + entries.text + "]}").encode("utf-8")


def _restore_bulk_body(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    body = context.pop(_PREBUILT_BODY, None)
    if body is not None:
        params["body"] = body


@dataclass
class CallClock:
    """One SendBulkEmail's instants (time.monotonic()), kept by botocore's hooks in the
    calling thread: the request leaves no earlier than `not_before`, `sent_at` is when it
    left (serialised and signed), `answered_at` when SES's whole answer had arrived (before
    it is parsed; None when none came). SES accepts a call between those two instants, so a
    window that counts it over them counts it where SES does, without the thread hops and
    the client's own work either side."""

    not_before: float = float("-inf")
    sent_at: float | None = None
    answered_at: float | None = None


_current = threading.local()


def _gate_send(**_: Any) -> None:
    clock: CallClock | None = getattr(_current, "clock", None)
    if clock is None:
        return
    wait = clock.not_before - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    clock.sent_at = time.monotonic()
    # Returning nothing lets botocore send the request itself.


def _note_answer(**_: Any) -> None:
    clock: CallClock | None = getattr(_current, "clock", None)
    if clock is not None:
        clock.answered_at = time.monotonic()


def _translate(exc: Exception) -> SesCallFailed:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return SesCallFailed(
            err.get("Code"), status, timed_out=False, message=err.get("Message", "")
        )
    if isinstance(exc, ReadTimeoutError | ConnectionClosedError):
        # The request went out; SES may have accepted it. The caller must not resend.
        return SesCallFailed("ReadTimeout", None, timed_out=True, message=str(exc))
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
        # Nothing was sent: safe to retry.
        return SesCallFailed("ConnectError", None, timed_out=False, message=str(exc))
    return SesCallFailed(type(exc).__name__, None, timed_out=True, message=str(exc))


class SesSender:
    """`send_bulk` and `send_templated`, blocking (run them in a thread pool)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        events = client.meta.events
        for (event, unique_id), handler in zip(
            _HOOKS,
            (_prebuild_bulk_body, _restore_bulk_body, _gate_send, _note_answer),
            strict=True,
        ):
            events.register(event, handler, unique_id=unique_id)  # once per client

    def send_bulk(
        self,
        *,
        from_address: str,
        template: str,
        entries: Sequence[BulkEntry],
        configuration_set: str | None = None,
        default_tags: Mapping[str, str] | None = None,
        default_data: Mapping[str, Any] | None = None,
        clock: CallClock | None = None,
    ) -> list[EntryStatus]:
        """With `clock`, the request waits in this thread until `clock.not_before`, and the
        clock gets the instants it left and its answer arrived."""
        if not 1 <= len(entries) <= MAX_BULK_ENTRIES:
            raise ValueError(
                f"SendBulkEmail takes 1..{MAX_BULK_ENTRIES} entries, got {len(entries)}"
            )
        request: dict[str, Any] = {
            "FromEmailAddress": from_address,
            "DefaultContent": {
                "Template": {
                    "TemplateName": template,
                    "TemplateData": json.dumps(dict(default_data or {})),
                }
            },
        }
        if configuration_set:
            request["ConfigurationSetName"] = configuration_set
        if default_tags:
            request["DefaultEmailTags"] = [{"Name": k, "Value": v} for k, v in default_tags.items()]
        request["BulkEmailEntries"] = EncodedEntries.of(entries)
        _current.clock = clock
        try:
            response = self._client.send_bulk_email(**request)
        except Exception as exc:
            raise _translate(exc) from exc
        finally:
            _current.clock = None
        return [
            EntryStatus(r.get("Status", "FAILED"), r.get("MessageId"), r.get("Error"))
            for r in response.get("BulkEmailEntryResults", [])
        ]

    def send_templated(
        self,
        *,
        from_address: str,
        to: str,
        template: str,
        data: Mapping[str, Any],
        configuration_set: str | None = None,
        tags: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """SendEmail with a stored template; returns the MessageId."""
        template_content: dict[str, Any] = {
            "TemplateName": template,
            "TemplateData": json.dumps(dict(data)),
        }
        if headers:
            template_content["Headers"] = [{"Name": k, "Value": v} for k, v in headers.items()]
        request: dict[str, Any] = {
            "FromEmailAddress": from_address,
            "Destination": {"ToAddresses": [to]},
            "Content": {"Template": template_content},
        }
        if configuration_set:
            request["ConfigurationSetName"] = configuration_set
        if tags:
            request["EmailTags"] = [{"Name": k, "Value": v} for k, v in tags.items()]
        try:
            response = self._client.send_email(**request)
        except Exception as exc:
            raise _translate(exc) from exc
        return str(response["MessageId"])

    def get_send_quota(self) -> dict[str, float]:
        try:
            quota = self._client.get_account().get("SendQuota", {})
        except Exception as exc:
            raise _translate(exc) from exc
        return {k: float(v) for k, v in quota.items()}

    def template_exists(self, name: str) -> bool:
        return self.get_template(name) is not None

    def _unless_missing(self, call: Callable[[], Any]) -> Any | None:
        """`call()`'s answer, or None when SES says the template is not there; any other
        failure is translated (SesCallFailed)."""
        try:
            return call()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NotFoundException":
                return None
            raise _translate(exc) from exc
        except Exception as exc:
            raise _translate(exc) from exc

    def get_template(self, name: str) -> dict[str, str] | None:
        """The template's subject, html and text, or None when SES has none of that name."""
        answer = self._unless_missing(lambda: self._client.get_email_template(TemplateName=name))
        if answer is None:
            return None
        content = answer["TemplateContent"]
        return {
            "name": name,
            "subject": str(content.get("Subject", "")),
            "html": str(content.get("Html", "")),
            "text": str(content.get("Text", "")),
        }

    def render_template(self, name: str, data: dict[str, Any]) -> str | None:
        """SES's own rendering of `name` with `data` (TestRenderEmailTemplate), as MIME text;
        None when SES has no template of that name."""
        answer = self._unless_missing(
            lambda: self._client.test_render_email_template(
                TemplateName=name, TemplateData=json.dumps(data)
            )
        )
        return None if answer is None else str(answer["RenderedTemplate"])

    def list_templates(self, limit: int = 100) -> list[dict[str, str]]:
        """Template names and creation times, every page up to `limit`."""
        out: list[dict[str, str]] = []
        token: str | None = None
        try:
            while len(out) < limit:
                page = self._client.list_email_templates(
                    PageSize=min(100, limit - len(out)), **({"NextToken": token} if token else {})
                )
                for t in page.get("TemplatesMetadata", []):
                    created = t.get("CreatedTimestamp")
                    out.append({"name": str(t["TemplateName"]), "created_at": str(created)})
                token = page.get("NextToken")
                if not token:
                    break
        except Exception as exc:
            raise _translate(exc) from exc
        return out

    def put_template(self, name: str, subject: str, html: str, text: str) -> None:
        content = {"Subject": subject, "Html": html, "Text": text}
        try:
            if self.template_exists(name):
                self._client.update_email_template(TemplateName=name, TemplateContent=content)
            else:
                self._client.create_email_template(TemplateName=name, TemplateContent=content)
        except SesCallFailed:
            raise
        except Exception as exc:
            raise _translate(exc) from exc
