"""The SMS channel: one SendTextMessage per recipient, sent concurrently within a lane call.

The lane hands over up to `call_size` rows per call (FLASHSEND_SMS_CALL_SIZE, 10), paced and
counted as one call of that many messages (streams.sender), exactly as for email; a campaign
limited in segments (campaigns.rate_unit) counts each row's segments instead (`row_segments`).
Here each row becomes its own request, and the requests of a call run at once on a thread pool of
`inflight` threads shared by all lanes of the worker (boto3 is blocking): a worker's
throughput is then about `inflight / latency` instead of `lanes / latency`. The rows of a call
enter it together, so a worker killed mid-call leaves at most `call_size` rows per lane
unknown, and a pause lets at most one call's messages out per lane (each message checks the
campaign right before its request; those not started yet go back to the lane, which
releases them).

Numbers are checked before any request (streams.rules.phones): an invalid one is skipped,
`invalid_phone:<why>`. Quiet hours: a row whose local send window has ended (its
`send_before`, set at snapshot) is skipped, `quiet_hours`, before its request, checked when
the call is built and again right before the request (a message can wait for a free
thread). Each answer maps through streams.rules.sms_outcomes. Segments of every
message sent are counted (streams.rules.sms_text) in `flashsend_sms_segments_total`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flashsend import metrics
from sinks.recipient_store import ClaimedRecipient, LiveCampaign, RowResult
from sinks.sms import SmsCallFailed, SmsSender, TextMessage
from streams.call_outcome import CallOutcome
from streams.provider_calls import ProviderCalls, wait_until
from streams.rules.phones import INVALID_PHONE, normalise_phone, phone_problem
from streams.rules.sms_outcomes import TextOutcome, classify_text_error
from streams.rules.sms_text import count_segments, render_body

API = "SendTextMessage"
QUIET_HOURS = "quiet_hours"


# _one's answer for a row whose send window ended while it waited for a thread.
# Never raised: a marker that no request was made.
QUIET = SmsCallFailed(QUIET_HOURS, None, timed_out=False, message="the send window has ended")


def past_deadline(row: ClaimedRecipient, now: datetime) -> bool:
    """Whether the row's local send window has ended (never, for a row without one)."""
    return row.send_before is not None and now >= row.send_before


def utc_now() -> datetime:
    return datetime.now(UTC)


def body_values(row: ClaimedRecipient) -> dict[str, Any]:
    values: dict[str, Any] = {"first_name": row.first_name or "there", "user_id": row.user_id}
    if row.promo_code is not None:
        values["promo_code"] = row.promo_code
    return values


def message_context(row: ClaimedRecipient) -> dict[str, str]:
    """Comes back on every event of the message: the row is found by campaign + seq."""
    context = {"campaign": str(row.campaign_id), "seq": str(row.seq)}
    if row.variant is not None:
        context["variant"] = row.variant
    return context


def row_segments(campaign: LiveCampaign, row: ClaimedRecipient) -> int:
    """The segments `send` sends for `row`: its body rendered as `send` renders it; 0 for an
    invalid number or a row past its send window (skipped without a request). A campaign
    limited in segments charges each row this much (campaigns.rate_unit, streams.rules.throttle
    WindowPacer.admit_costs)."""
    if phone_problem(normalise_phone(row.email)) is not None or past_deadline(row, utc_now()):
        return 0
    return count_segments(render_body(campaign.template_for(row.variant), body_values(row))).count


# On the instance, not the class's function: a subclass's override is the one that runs.
def _send_text(sms: SmsSender, message: TextMessage) -> str:
    return sms.send_text(message)


class SmsChannel:
    def __init__(
        self,
        sms: SmsSender | Callable[[], SmsSender],
        *,
        inflight: int,
        is_sending: Callable[[int], bool],
        call_size: int = 10,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.max_entries = call_size
        self._clock = clock
        self._calls = ProviderCalls(sms, SmsSender, inflight=inflight, name="sms")
        self._is_sending = is_sending
        self.stats: dict[str, int] = {"calls": 0}

    async def send(
        self,
        campaign: LiveCampaign,
        rows: list[ClaimedRecipient],
        not_before: float = float("-inf"),
    ) -> CallOutcome:
        await wait_until(not_before)
        outcome = CallOutcome([], [])
        requests: list[tuple[ClaimedRecipient, TextMessage]] = []
        now = self._clock()
        for r in rows:
            if past_deadline(r, now):
                outcome.final.append(RowResult(r.seq, "skipped", QUIET_HOURS, None))
                continue
            number = normalise_phone(r.email)
            problem = phone_problem(number)
            if problem is not None:
                reason = f"{INVALID_PHONE}:{problem}"
                outcome.final.append(RowResult(r.seq, "skipped", reason, None))
                continue
            body = render_body(campaign.template_for(r.variant), body_values(r))
            requests.append(
                (
                    r,
                    TextMessage(
                        destination=number,
                        body=body,
                        origination_identity=campaign.from_address,
                        configuration_set=campaign.configuration_set,
                        context=message_context(r),
                    ),
                )
            )
        answers = await asyncio.gather(*(self._one(campaign.id, r, m) for r, m in requests))
        answer_times: list[float | None] = []
        segments = 0
        for (row, message), (message_id, failure, answered_at) in zip(
            requests, answers, strict=True
        ):
            answer_times.append(answered_at)
            if message_id is not None:
                outcome.final.append(RowResult(row.seq, "sent", None, message_id))
                segments += count_segments(message.body).count
                continue
            if failure is QUIET:
                outcome.final.append(RowResult(row.seq, "skipped", QUIET_HOURS, None))
                continue
            if failure is None:  # the campaign stopped sending before this one's turn
                outcome.retry.append(row)
                outcome.retry_reason = outcome.retry_reason or "stopped_before_call"
                continue
            verdict = classify_text_error(
                failure.code, failure.http_status, failure.reason, timed_out=failure.timed_out
            )
            if verdict.outcome is TextOutcome.RETRY:
                outcome.retry.append(row)
                outcome.retry_reason = verdict.reason
                outcome.throttled = outcome.throttled or verdict.throttled
            elif verdict.outcome is TextOutcome.PAUSE_CAMPAIGN:
                outcome.final.append(RowResult(row.seq, "pending", verdict.reason, None))
                outcome.pause_reason = verdict.reason
            else:
                status = verdict.outcome.value
                outcome.final.append(RowResult(row.seq, status, verdict.reason, None))
        if answer_times and None not in answer_times:
            outcome.answered_at = max(t for t in answer_times if t is not None)
        metrics.count_sms_segments(campaign.id, segments)
        return outcome

    async def _one(
        self, campaign_id: int, row: ClaimedRecipient, message: TextMessage
    ) -> tuple[str | None, SmsCallFailed | None, float | None]:
        """(MessageId, None, answered at) or (None, failure, answered at or None); (None, None,
        now) when the campaign stopped sending before this message's request, (None, QUIET,
        now) when the row's send window ended before it."""
        async with self._calls.slots:
            if not self._is_sending(campaign_id):
                return None, None, time.monotonic()
            if past_deadline(row, self._clock()):
                return None, QUIET, time.monotonic()
            self.stats["calls"] += 1
            began = time.monotonic()
            try:
                message_id, answered_at = await self._calls.call(_send_text, message)
            except SmsCallFailed as exc:
                metrics.observe_ses_call(API, time.monotonic() - began, exc.code or "error")
                answered = None if exc.http_status is None else time.monotonic()
                return None, exc, answered
            metrics.observe_ses_call(API, answered_at - began, "ok")
            return message_id, None, answered_at

    def segments(self, campaign: LiveCampaign, row: ClaimedRecipient) -> int:
        return row_segments(campaign, row)

    def close(self) -> None:
        self._calls.close()
