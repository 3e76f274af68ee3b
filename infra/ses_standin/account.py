"""The simulated SES account: templates, sending limits, faults and accepted mail.

No HTTP here: `server.py` parses requests with `protocol.py`, calls `SesAccount` and writes the
answer. Everything runs on one asyncio loop, so no locking. Order of checks for a send call:
validation (400; also the `refuse_addresses` fault) → sending paused → random 429 → rate limit
(429, nothing accepted) → template → per entry: daily quota, random transient failure → record.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from infra.ses_standin.config_sets import ConfigurationSets
from infra.ses_standin.errors import (
    BadRequest,
    LimitExceeded,
    NotFound,
    SendingPaused,
    SesError,
    TooManyRequests,
)
from infra.ses_standin.faults import FaultConfig, FaultDice
from infra.ses_standin.firehose import DeliveryStreams
from infra.ses_standin.index import PROMO_VARIABLE, UNTAGGED, MessageIndex
from infra.ses_standin.journal import JOURNAL_FILE, Journal, LineEncoder, Record
from infra.ses_standin.limits import RollingCounter, TokenBucket, quota_left
from infra.ses_standin.protocol import (
    BulkRequest,
    EmailRequest,
    RawContent,
    SimpleContent,
    TemplateRef,
)
from infra.ses_standin.push import PushAccount
from infra.ses_standin.recipients import Recipients, parse_address
from infra.ses_standin.sms import SmsAccount
from infra.ses_standin.template_store import TemplateStore
from infra.ses_standin.templates import (
    CompiledTemplate,
    TemplateContent,
    compile_template,
    render_parts,
)

log = logging.getLogger(__name__)

# Called once per accepted message, after it is journaled. The seam for event emission
# (Send/Delivery/Bounce… to SNS), which a later component plugs in.
MessageHook = Callable[[Record], None]

_PAUSED = {"Status": "ACCOUNT_SENDING_PAUSED", "Error": "Sending paused for this account."}
_NO_QUOTA = {"Status": "ACCOUNT_DAILY_QUOTA_EXCEEDED", "Error": "Daily message quota exceeded."}
_TRANSIENT = {"Status": "TRANSIENT_FAILURE", "Error": "Transient failure, try again later."}


class SesAccount:
    """One simulated SES account in one Region, persisted under `state_dir`."""

    def __init__(
        self,
        state_dir: Path,
        config: FaultConfig,
        *,
        seed: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.dice = FaultDice(seed)
        self.hung_calls = 0
        self.hung_recipients = 0
        self.clock = clock
        state_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(state_dir / JOURNAL_FILE)
        self.templates = TemplateStore(state_dir / "templates.json")
        self.configuration_sets = ConfigurationSets(state_dir / "configuration-sets.json")
        self.firehose = DeliveryStreams(state_dir / "firehose-streams.json")
        self.index = MessageIndex()
        self.sent_last_24h = RollingCounter()
        self.bucket = TokenBucket.full(config.max_send_rate, clock())
        self.on_accepted: list[MessageHook] = []
        # The SMS account (pinpoint-sms-voice-v2) shares the faults and the dice.
        self.sms = SmsAccount(lambda: self.config, self.dice.hit)
        self.push = PushAccount(lambda: self.config, self.dice.hit)  # SNS mobile push
        self._replay()

    # ---- sending -------------------------------------------------------------------------

    def send_bulk(self, request: BulkRequest, now: float) -> list[dict[str, str]]:
        """SendBulkEmail: one result per entry, in order (the `BulkEmailEntryResults`)."""
        config = self.config
        n_entries = len(request.entries)
        if config.refuse_addresses:
            for i, entry in enumerate(request.entries):
                _refuse(entry.recipients, config.refuse_addresses, f"BulkEmailEntries[{i}]")
        if not config.sending_enabled:
            return [_PAUSED] * n_entries
        self._admit(request.recipient_count, now)
        resolved = self._resolve(request.template)
        if resolved is None:
            error = f"Template {request.template.name} does not exist."
            return [{"Status": "TEMPLATE_NOT_FOUND", "Error": error}] * n_entries
        template_name, compiled = resolved
        left = quota_left(config.max_24h_send, self.sent_last_24h.total(now))
        p_transient = config.p_transient
        draw = self.dice.random
        id_base = _message_id_base(now)
        lines = LineEncoder(now, "bulk", request.sender, template_name, request.configuration_set)
        results: list[dict[str, str]] = []
        batch: list[tuple[Record, tuple[str, ...], str]] = []
        for i, entry in enumerate(request.entries):
            recipients = entry.recipients
            count = len(recipients.keys)
            if count > left:
                results.append(_NO_QUOTA)
                continue
            if p_transient > 0.0 and draw() < p_transient:
                results.append(_TRANSIENT)
                continue
            left -= count
            message_id = f"{id_base}-{i:06d}"
            missing = compiled.missing_variable(entry.data)
            record = _record(
                message_id,
                now,
                "bulk",
                request.sender,
                recipients,
                template_name,
                compiled.render_subject(entry.data),
                entry.headers,
                entry.tags,
                request.configuration_set,
                missing,
            )
            code = entry.data.get(PROMO_VARIABLE) if entry.data else None
            if isinstance(code, str):
                record["promo_code"] = code
            batch.append((record, recipients.keys, lines.line(record)))
            results.append({"Status": "SUCCESS", "MessageId": message_id})
        self._commit(now, batch)
        return results

    def send_email(self, request: EmailRequest, now: float) -> str:
        """SendEmail: the MessageId, or an SesError."""
        config = self.config
        if config.refuse_addresses:
            _refuse(request.recipients, config.refuse_addresses, "Destination")
        if not config.sending_enabled:
            raise SendingPaused()
        count = request.recipients.count
        self._admit(count, now)
        if count > quota_left(config.max_24h_send, self.sent_last_24h.total(now)):
            raise LimitExceeded("Daily message quota exceeded.")
        if self.dice.hit(config.p_transient):
            raise SesError("Transient failure, try again later.")
        content = request.content
        template_name: str | None = None
        missing: str | None = None
        if isinstance(content, TemplateRef):
            resolved = self._resolve(content)
            if resolved is None:
                raise NotFound(f"Template {content.name} does not exist.")
            template_name, compiled = resolved
            subject: str | None = compiled.render_subject(content.data)
            missing = compiled.missing_variable(content.data)
        elif isinstance(content, SimpleContent):
            subject = content.subject
        else:
            assert isinstance(content, RawContent)
            subject = content.subject
        message_id = f"{_message_id_base(now)}-000000"
        record = _record(
            message_id,
            now,
            "single",
            request.sender,
            request.recipients,
            template_name,
            subject,
            request.headers,
            request.tags,
            request.configuration_set,
            missing,
        )
        lines = LineEncoder(now, "single", request.sender, template_name, request.configuration_set)
        self._commit(now, [(record, request.recipients.keys, lines.line(record))])
        return message_id

    def hang_now(self) -> bool:
        """Whether this (already accepted) send call should never be answered."""
        return self.dice.hit(self.config.p_hang)

    def note_hang(self, accepted_recipients: int) -> None:
        """Count calls accepted but never answered: the client can only mark them unknown."""
        self.hung_calls += 1
        self.hung_recipients += accepted_recipients

    def latency_s(self) -> float:
        return self.dice.latency_s(self.config)

    def account(self, now: float) -> dict[str, Any]:
        """GetAccount. Unlimited values are reported as -1 (SES's convention for quotas)."""
        config = self.config
        return {
            "DedicatedIpAutoWarmupEnabled": False,
            "EnforcementStatus": "HEALTHY",
            "ProductionAccessEnabled": True,
            "SendingEnabled": config.sending_enabled,
            "SendQuota": {
                "Max24HourSend": config.max_24h_send if config.max_24h_send > 0 else -1.0,
                "MaxSendRate": config.max_send_rate if config.max_send_rate > 0 else -1.0,
                "SentLast24Hours": float(self.sent_last_24h.total(now)),
            },
            "SuppressionAttributes": {"SuppressedReasons": ["BOUNCE", "COMPLAINT"]},
            "Details": {
                "MailType": "MARKETING",
                "WebsiteURL": "https://flashsend.invalid",
                "ContactLanguage": "EN",
                "UseCaseDescription": "flashsend local SES stand-in",
                "ReviewDetails": {"Status": "GRANTED", "CaseId": "ses-standin"},
            },
        }

    # ---- templates -----------------------------------------------------------------------

    def create_template(self, name: str, content: TemplateContent, now: float) -> None:
        self.templates.create(name, content, now)

    def get_template(self, name: str) -> dict[str, Any]:
        template = self.templates.get(name)
        return {"TemplateName": template.name, "TemplateContent": template.content.to_wire()}

    def render_template(self, name: str, data: dict[str, Any]) -> str:
        """TestRenderEmailTemplate: the message as MIME text, rendered as a send would."""
        from email.message import EmailMessage

        stored = self.templates.get(name)  # NotFound for an unknown name
        compiled = stored.compiled
        message = EmailMessage()
        message["Subject"] = render_parts(compiled.subject, data)
        message.set_content(render_parts(compiled.text, data))
        if compiled.html:
            message.add_alternative(
                render_parts(compiled.html, data, html_escape=True), subtype="html"
            )
        return message.as_string()

    def update_template(self, name: str, content: TemplateContent) -> None:
        self.templates.update(name, content)

    def delete_template(self, name: str) -> None:
        self.templates.delete(name)

    def list_templates(self, size: int, token: str | None) -> dict[str, Any]:
        page, next_token = self.templates.page(size, token)
        body: dict[str, Any] = {
            "TemplatesMetadata": [
                {"TemplateName": t.name, "CreatedTimestamp": t.created} for t in page
            ]
        }
        if next_token is not None:
            body["NextToken"] = next_token
        return body

    # ---- admin ---------------------------------------------------------------------------

    def configure(self, changes: Mapping[str, Any], now: float) -> FaultConfig:
        """Apply partial settings; a new MaxSendRate starts with a full bucket."""
        new = self.config.updated(changes)
        if new.max_send_rate != self.config.max_send_rate:
            self.bucket = TokenBucket.full(new.max_send_rate, now)
        self.config = new
        log.info("faults_updated %s", " ".join(f"{k}={v}" for k, v in new.to_dict().items()))
        return new

    def reset(self, now: float, *, templates: bool = False) -> None:
        """Forget every accepted message (and optionally every template)."""
        self.journal.clear()
        self.index.clear()
        self.sent_last_24h.clear()
        self.bucket = TokenBucket.full(self.config.max_send_rate, now)
        if templates:
            self.templates.clear()
        log.info("state_reset templates=%s", templates)

    def messages(
        self, campaign: str | None = None, destination: str | None = None, limit: int = 100
    ) -> list[Record]:
        """Last `limit` records of a campaign, of everything, or sent to one address."""
        if limit <= 0:
            return []
        if destination is not None:
            offsets = self.index.destination_offsets(_normalize(destination))
        else:
            offsets = self.index.select(campaign).offsets
        return self.journal.read(offsets[-limit:])

    def close(self) -> None:
        self.journal.close()

    # ---- internals -----------------------------------------------------------------------

    def _admit(self, recipients: int, now: float) -> None:
        """Call-level throttling: random 429, then the per-recipient token bucket."""
        if self.dice.hit(self.config.p429):
            raise TooManyRequests()
        granted, self.bucket = self.bucket.take(recipients, now)
        if not granted:
            raise TooManyRequests()

    def _resolve(self, ref: TemplateRef) -> tuple[str | None, CompiledTemplate] | None:
        if ref.name is not None:
            stored = self.templates.find(ref.name)
            return None if stored is None else (stored.name, stored.compiled)
        assert ref.inline is not None
        return None, compile_template(ref.inline)

    def _commit(self, now: float, batch: list[tuple[Record, tuple[str, ...], str]]) -> None:
        """Journal a call's accepted messages (one write), index them, run the hooks."""
        if not batch:
            return
        offsets = self.journal.append([line for _record, _keys, line in batch])
        self.index.add_call(
            now,
            [
                (record["tags"].get("campaign", UNTAGGED), keys, offset, _failed(record))
                for (record, keys, _line), offset in zip(batch, offsets, strict=True)
            ],
        )
        for record, keys, _line in batch:
            if "promo_code" in record:
                campaign = record["tags"].get("campaign", UNTAGGED)
                self.index.add_promo(campaign, keys, record["promo_code"])
        self.sent_last_24h.add(now, sum(len(keys) for _record, keys, _line in batch))
        for hook in self.on_accepted:
            for record, _keys, _line in batch:
                hook(record)

    def _replay(self) -> None:
        started = time.perf_counter()
        cutoff = self.clock() - self.sent_last_24h.window_s
        count = 0
        for offset, record in self.journal.replay():
            keys = tuple(
                _normalize(address)
                for field in ("destination", "cc", "bcc")
                for address in record.get(field, ())
            )
            t = float(record["time"])
            campaign = record.get("tags", {}).get("campaign", UNTAGGED)
            self.index.add(t, campaign, keys, offset, _failed(record))
            if "promo_code" in record:
                self.index.add_promo(campaign, keys, record["promo_code"])
            if t > cutoff:
                self.sent_last_24h.add(t, len(keys))
            count += 1
        log.info("journal_replayed messages=%d seconds=%.3f", count, time.perf_counter() - started)


def _record(
    message_id: str,
    now: float,
    operation: str,
    sender: str,
    recipients: Recipients,
    template: str | None,
    subject: str | None,
    headers: dict[str, str],
    tags: dict[str, str],
    configuration_set: str | None,
    missing_variable: str | None,
) -> Record:
    record: Record = {
        "message_id": message_id,
        "time": now,
        "operation": operation,
        "from": sender,
        "destination": list(recipients.to),
    }
    if recipients.cc:
        record["cc"] = list(recipients.cc)
    if recipients.bcc:
        record["bcc"] = list(recipients.bcc)
    record["template"] = template
    record["subject"] = subject
    record["headers"] = headers
    record["tags"] = tags
    record["configuration_set"] = configuration_set
    record["rendering_failure"] = (
        None
        if missing_variable is None
        else f"Attribute '{missing_variable}' is not present in the rendering data."
    )
    return record


def _refuse(recipients: Recipients, pattern: str, where: str) -> None:
    """The fault `refuse_addresses`: BadRequest naming the first destination it finds."""
    for address in (*recipients.to, *recipients.cc, *recipients.bcc):
        if re.search(pattern, address):
            raise BadRequest(f"Illegal address: {address!r} in {where}.Destination.")


def _failed(record: Record) -> bool:
    return record.get("rendering_failure") is not None


def _message_id_base(now: float) -> str:
    # Shaped like SES ids ("0100018c…-<uuid>-000000"): time prefix + a fresh uuid per call;
    # entries append their index, so ids are unique without a uuid per entry.
    return f"0100{int(now * 1000):012x}-{uuid.uuid4()}"


def _normalize(address: str) -> str:
    try:
        return parse_address(address, "destination")[1]
    except BadRequest:
        return address.lower()
