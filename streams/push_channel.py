"""The push channel: one SNS Publish per enabled device endpoint of each recipient, sent
concurrently within a lane call.

A push row is one user; its address holds the ids of the user's enabled endpoints at the
snapshot (sinks/sql/push.sql), and the lanes charge it one unit of the campaign's rate per
endpoint (`row_publishes`): the limit counts publishes, as SNS's account quota does. The lane
hands over up to `call_size` rows per call (FLASHSEND_PUSH_CALL_SIZE); their publishes run at
once on a thread pool of `inflight` threads shared by all lanes of the worker, as for SMS.

Right before the publishes the endpoints are read again (one statement per call): a user who
turned push off since the snapshot is skipped, `push_opted_out`; an endpoint disabled since
(the feedback worker heard the platform call its token invalid) is left out, and a row left
with none is skipped, `endpoint_disabled:<reason>`. Quiet hours as for SMS: a row whose local
send window has ended is skipped, `quiet_hours`, checked when the call is built and again right
before each publish. Each publish checks that the campaign is still sending right before its
request.

Never two notifications on one device. The rows of a call enter it together (in_call_at), so
a worker killed mid-call leaves them unknown and nobody publishes them again; a row goes back
to its lane (`retry`) only when none of its publishes may have reached SNS (all throttled,
refused before the request, or stopped before their turn). A row with one device published
and another throttled keeps its call: the throttled publishes are tried again here, after a
backoff, while the campaign is sending; those still unsent when it stops are reported in the
row's reason (`unsent:N`). Each device's answer maps through streams.rules.push_outcomes; a row is
`sent` when at least one device took its notification (reason `devices:<sent>/<total>` plus
what happened to the others when not all did), `unknown` when none did and one may have,
`failed` or `skipped` otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from flashsend import metrics
from sinks.offsets import StoreUnavailable
from sinks.push import Notification, PushCallFailed, PushSender
from sinks.push_store import DeviceEndpoint, PushStore
from sinks.recipient_store import ClaimedRecipient, LiveCampaign, RowResult
from streams.call_outcome import CallOutcome
from streams.provider_calls import ProviderCalls, wait_until
from streams.rules.push_message import PushContent, build_message, disabled_ids, endpoint_ids
from streams.rules.push_outcomes import DeviceOutcome, DeviceVerdict, classify_publish_error
from streams.sms_channel import QUIET_HOURS, body_values, message_context, past_deadline

API = "Publish"
PUSH_OPTED_OUT = "push_opted_out"
ENDPOINT_DISABLED = "endpoint_disabled"
RETRY_BACKOFF_S = (0.2, 0.5, 1.0)  # then every 1 s: throttled publishes of a started row
STOPPED = DeviceVerdict(DeviceOutcome.RETRY, "stopped_before_call")
QUIET = DeviceVerdict(DeviceOutcome.RETRY, QUIET_HOURS)


def utc_now() -> datetime:
    return datetime.now(UTC)


def row_publishes(row: ClaimedRecipient, now: datetime) -> int:
    """What `row` costs against the campaign's rate: one publish per endpoint of its address;
    0 for a row past its send window (skipped without a request)."""
    return 0 if past_deadline(row, now) else len(endpoint_ids(row.email))


def content_of(campaign: LiveCampaign, variant: str | None) -> PushContent:
    return PushContent(
        title=campaign.from_address,
        template=campaign.template_for(variant),
        ttl_s=campaign.push_ttl_s,
        collapse_key=campaign.push_collapse_key,
    )


@dataclass
class RowDevices:
    """One row's publishes: its endpoints and what each came to (None: not published yet)."""

    row: ClaimedRecipient
    endpoints: list[DeviceEndpoint]
    skipped: list[str] = field(default_factory=list)  # reasons of endpoints left out
    results: dict[int, tuple[str | None, DeviceVerdict | None]] = field(default_factory=dict)

    def sent(self) -> list[str]:
        return [mid for mid, _ in self.results.values() if mid is not None]

    def verdicts(self) -> list[DeviceVerdict]:
        return [v for _, v in self.results.values() if v is not None]

    def started(self) -> bool:
        """Some publish of the row may have reached SNS: the row cannot be sent again."""
        return bool(self.sent()) or any(v.outcome is DeviceOutcome.UNKNOWN for v in self.verdicts())

    def to_retry(self) -> list[DeviceEndpoint]:
        return [
            e
            for e in self.endpoints
            if (v := self.results.get(e.id, (None, None))[1]) is not None
            and v.outcome is DeviceOutcome.RETRY
        ]


# On the instance, not the class's function: a subclass's override is the one that runs.
def _publish(push: PushSender, notification: Notification) -> str:
    return push.publish(notification)


class PushChannel:
    def __init__(
        self,
        push: PushSender | Callable[[], PushSender],
        store: PushStore,
        *,
        inflight: int,
        is_sending: Callable[[int], bool],
        call_size: int = 10,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.max_entries = call_size
        self._clock = clock
        self._store = store
        self._calls = ProviderCalls(push, PushSender, inflight=inflight, name="push")
        self._is_sending = is_sending
        self.stats: dict[str, int] = {"calls": 0, "republished_after_throttle": 0}

    async def send(
        self,
        campaign: LiveCampaign,
        rows: list[ClaimedRecipient],
        not_before: float = float("-inf"),
    ) -> CallOutcome:
        await wait_until(not_before)
        outcome = CallOutcome([], [])
        try:
            known = await self._store.endpoints(
                [i for r in rows for i in (*endpoint_ids(r.email), *disabled_ids(r.email))]
            )
        except StoreUnavailable:
            outcome.retry = list(rows)
            outcome.retry_reason = "store_unavailable"
            outcome.answered = False
            return outcome
        now = self._clock()
        planned: list[RowDevices] = []
        for r in rows:
            if past_deadline(r, now):
                outcome.final.append(RowResult(r.seq, "skipped", QUIET_HOURS, None))
                continue
            devices = RowDevices(r, [])
            for i in disabled_ids(r.email):  # disabled before the snapshot: named, not sent
                e = known.get(i)
                reason = (e.disabled_reason if e is not None else None) or "-"
                devices.skipped.append(f"{ENDPOINT_DISABLED}:{reason}")
            for i in endpoint_ids(r.email):
                e = known.get(i)
                if e is None or e.user_id != r.user_id:
                    devices.skipped.append("endpoint_removed")
                elif not e.enabled:
                    devices.skipped.append(f"{ENDPOINT_DISABLED}:{e.disabled_reason or '-'}")
                else:
                    devices.endpoints.append(e)
            if any(e.push_opt_out for e in known.values() if e.user_id == r.user_id):
                outcome.final.append(RowResult(r.seq, "skipped", PUSH_OPTED_OUT, None))
            elif not devices.endpoints:
                reason = devices.skipped[-1] if devices.skipped else "no_device"
                outcome.final.append(RowResult(r.seq, "skipped", reason, None))
            else:
                planned.append(devices)
        answer_times: list[float | None] = []
        await self._publish_all(
            campaign, planned, [(d, d.endpoints) for d in planned], answer_times
        )
        attempt = 0
        while True:
            again = [(d, d.to_retry()) for d in planned if d.started() and d.to_retry()]
            if not again or not self._is_sending(campaign.id):
                break
            await asyncio.sleep(RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)])
            attempt += 1
            self.stats["republished_after_throttle"] += sum(len(e) for _, e in again)
            await self._publish_all(campaign, planned, again, answer_times)
        disabled: dict[str, list[str]] = {}
        for d in planned:
            self._settle(d, outcome, disabled)
        for reason, arns in disabled.items():
            with contextlib.suppress(StoreUnavailable):  # the next publish answers it again
                await self._store.disable(arns, reason)
        if answer_times and None not in answer_times:
            outcome.answered_at = max(t for t in answer_times if t is not None)
        return outcome

    async def _publish_all(
        self,
        campaign: LiveCampaign,
        planned: list[RowDevices],
        todo: list[tuple[RowDevices, list[DeviceEndpoint]]],
        answer_times: list[float | None],
    ) -> None:
        jobs = [(d, e) for d, endpoints in todo for e in endpoints]
        answers = await asyncio.gather(*(self._one(campaign, d.row, e) for d, e in jobs))
        for (d, e), (message_id, verdict, answered_at) in zip(jobs, answers, strict=True):
            d.results[e.id] = (message_id, verdict)
            if verdict is not STOPPED and verdict is not QUIET:
                answer_times.append(answered_at)

    def _settle(self, d: RowDevices, outcome: CallOutcome, disabled: dict[str, list[str]]) -> None:
        """The row's one result from its devices' answers (see the module docstring)."""
        row, sent, verdicts = d.row, d.sent(), d.verdicts()
        for e in d.endpoints:
            v = d.results.get(e.id, (None, None))[1]
            if v is not None and v.outcome is DeviceOutcome.DISABLED:
                disabled.setdefault(v.reason, []).append(e.endpoint_arn)
        notes = [*d.skipped]
        for v in verdicts:
            if v.outcome is DeviceOutcome.RETRY:
                notes.append("unsent:" + v.reason)
            elif v.outcome is not DeviceOutcome.SENT:
                notes.append(v.reason)
        pause = next((v for v in verdicts if v.outcome is DeviceOutcome.PAUSE_CAMPAIGN), None)
        if pause is not None:
            outcome.pause_reason = outcome.pause_reason or pause.reason
        if sent:
            total = len(d.endpoints) + len(d.skipped)
            reason = None if not notes else f"devices:{len(sent)}/{total} " + " ".join(notes)
            outcome.final.append(RowResult(row.seq, "sent", reason and reason[:500], sent[0]))
            return
        if d.started():  # none accepted, one may have been: in doubt, never resent
            outcome.final.append(RowResult(row.seq, "unknown", " ".join(notes)[:500], None))
            return
        retry = [v for v in verdicts if v.outcome is DeviceOutcome.RETRY]
        if pause is not None:
            outcome.final.append(RowResult(row.seq, "pending", pause.reason, None))
        elif any(v is QUIET for v in retry) and len(retry) == len(verdicts):
            outcome.final.append(RowResult(row.seq, "skipped", QUIET_HOURS, None))
        elif retry:
            outcome.retry.append(row)
            first = retry[0]
            outcome.retry_reason = outcome.retry_reason or first.reason
            outcome.throttled = outcome.throttled or any(v.throttled for v in retry)
        elif any(v.outcome is DeviceOutcome.FAILED for v in verdicts):
            outcome.final.append(RowResult(row.seq, "failed", " ".join(notes)[:500], None))
        else:
            outcome.final.append(RowResult(row.seq, "skipped", notes[0] if notes else "", None))

    async def _one(
        self, campaign: LiveCampaign, row: ClaimedRecipient, endpoint: DeviceEndpoint
    ) -> tuple[str | None, DeviceVerdict | None, float | None]:
        """(MessageId, None, answered at) or (None, verdict, answered at or None)."""
        async with self._calls.slots:
            if not self._is_sending(campaign.id):
                return None, STOPPED, time.monotonic()
            if past_deadline(row, self._clock()):
                return None, QUIET, time.monotonic()
            message, attributes = build_message(
                content_of(campaign, row.variant),
                body_values(row),
                message_context(row),
                endpoint.platform,
            )
            notification = Notification(endpoint.endpoint_arn, message, attributes)
            self.stats["calls"] += 1
            began = time.monotonic()
            try:
                message_id, answered_at = await self._calls.call(_publish, notification)
            except PushCallFailed as exc:
                metrics.observe_ses_call(API, time.monotonic() - began, exc.code or "error")
                answered = None if exc.http_status is None else time.monotonic()
                verdict = classify_publish_error(exc.code, exc.http_status, timed_out=exc.timed_out)
                return None, verdict, answered
            metrics.observe_ses_call(API, answered_at - began, "ok")
            return message_id, None, answered_at

    def segments(self, campaign: LiveCampaign, row: ClaimedRecipient) -> int:
        return row_publishes(row, self._clock())

    def close(self) -> None:
        self._calls.close()
