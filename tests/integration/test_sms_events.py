"""SMS events close the loop on the real stack: the stand-in publishes TEXT_* events of the
campaign's configuration set and replies to its two-way number (signed SNS) to a real
`flashsend webhook` process, which puts them on mail.events; a real feedback worker settles the
rows in doubt and suppresses a number that texted STOP, without waiting for the next campaign's
start (whose opt-out sync would also catch it)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flashsend.lab.demo import SMS_BODY
from flashsend.lab.feedback_run import WebhookProcess, feedback_lag, insert_users, with_feedback
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.ses_standin.events_admin import SesEventsAdmin
from producers.campaign import start_campaign
from producers.campaign_ops import create_campaign
from sinks.sms import make_sms_client
from tests.integration.campaign_helpers import recipient_rows as rows
from tests.integration.campaign_helpers import sql, statuses, wait_finished

USERS = 40
IN_DOUBT = list(range(1, 11))  # accepted by the provider; the answers were lost


@pytest.fixture
def loop(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, SesEventsAdmin]]:
    """Own SMS configuration set, SNS topic and webhook process. The topic is both the
    configuration set's event destination and the origination number's two-way channel."""
    suffix = uuid.uuid4().hex[:8]
    s = with_feedback(settings, sms_configuration_set=f"marketing-sms-{suffix}")
    assert s.ses_endpoint_url
    events = SesEventsAdmin(s.ses_endpoint_url)
    webhook = WebhookProcess.start(s, tmp_path)
    topic = s.sns_topic_arns[0]
    sub = events.subscribe(webhook.sns_url, topic, configuration_sets=[s.sms_configuration_set])
    sms = make_sms_client(s, pool=2)
    number = s.sms_origination_identity
    try:
        events.wait_confirmed(sub["id"])
        sms.update_phone_number(PhoneNumberId=number, TwoWayEnabled=True, TwoWayChannelArn=topic)
        yield s, events
    finally:
        sms.update_phone_number(PhoneNumberId=number, TwoWayEnabled=False)
        events.unsubscribe(sub["id"])
        webhook.stop()


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds it took; AssertionError after `timeout`."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out waiting: {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def suppression(settings: Settings, number: str) -> tuple[Any, ...] | None:
    found = sql(
        settings, "SELECT reason, source_event FROM email_suppressions WHERE email = %s", number
    )
    return found[0] if found else None


def campaigns(settings: Settings) -> int:
    return int(sql(settings, "SELECT count(*) FROM campaigns")[0][0])


def test_text_events_settle_unknown_rows_and_stop_suppresses_at_once(
    loop: tuple[Settings, SesEventsAdmin], tmp_path: Path
) -> None:
    s, events = loop
    insert_users(s, USERS, f"r{uuid.uuid4().hex[:8]}.test")
    prefix = f"+33{uuid.uuid4().int % 10**5:05d}"  # numbers of their own: the stand-in is shared
    sql(s, "UPDATE users SET phone = %s || lpad(id::text, 4, '0')", prefix)
    first = create_campaign(s, name="sms-events", template=SMS_BODY, rate=0, channel="sms")
    start_campaign(s, first)
    senders = WorkerPool(s, tmp_path / "senders")
    feedback = WorkerPool(s, tmp_path / "feedback", role="feedback")
    try:
        senders.start(1)
        wait_finished(s, first, senders)
        sent = rows(s, first)
        assert {r[0] for r in sent.values()} == {"sent"}, sent
        # The answers of ten accepted messages are lost: their rows are unknown, as a killed
        # worker's lease expiry leaves them. Their TEXT_DELIVERED events wait in mail.events:
        # no feedback worker yet.
        sql(
            s,
            "UPDATE campaign_recipients SET status = 'unknown', reason = 'lease_expired', "
            "message_id = NULL, sent_at = NULL WHERE campaign_id = %s AND seq = ANY(%s)",
            first,
            IN_DOUBT,
        )
        assert statuses(s, first) == {"sent": USERS - len(IN_DOUBT), "unknown": len(IN_DOUBT)}
        wait_for("one event per message on mail.events", lambda: feedback_lag(s) >= USERS, 60)

        feedback.start(1)
        wait_for(
            "the events settle the unknown rows", lambda: statuses(s, first) == {"sent": USERS}, 120
        )
        wait_for("the feedback worker caught up", lambda: feedback_lag(s) == 0, 60)
        after = rows(s, first)
        for q in IN_DOUBT:
            assert after[q][:3] == ("sent", "resolved_by_event", sent[q][2]), (q, after[q])
        for q in set(sent) - set(IN_DOUBT):
            assert after[q] == sent[q], q  # a row already sent keeps its own answer

        # A recipient texts STOP (any case) during the campaign's life; another texts HELP.
        stopper, helper = str(sent[3][3]), str(sent[4][3])
        existing = campaigns(s)
        events.sms_inbound(stopper, "stop", to=s.sms_origination_identity)
        events.sms_inbound(helper, "HELP", to=s.sms_origination_identity)
        # "Within a few seconds": the emitter, webhook and feedback worker share two cores.
        wait_for("STOP suppresses the number", lambda: suppression(s, stopper) is not None, 15)
        assert campaigns(s) == existing  # no campaign start (and its opt-out sync) did it
        reason, source = suppression(s, stopper) or ()
        assert reason == "sms_opt_out" and str(source).startswith("SmsInbound STOP sms:"), source
        events.wait_drained()
        wait_for("the feedback worker caught up", lambda: feedback_lag(s) == 0, 30)
        assert suppression(s, helper) is None
        # Texting STOP again changes nothing (a new reply, the same number: the first reason).
        events.sms_inbound(stopper, "STOP", to=s.sms_origination_identity)
        events.wait_drained()  # delivered: the webhook answers once Kafka has the record
        wait_for("the feedback worker caught up", lambda: feedback_lag(s) == 0, 30)
        assert suppression(s, stopper) == (reason, source)

        second = create_campaign(s, name="sms-events-2", template=SMS_BODY, rate=0, channel="sms")
        start_campaign(s, second)
        wait_finished(s, second, senders)
    finally:
        senders.stop()
        feedback.stop()
    numbers = {r[3] for r in rows(s, second).values()}
    assert stopper not in numbers and helper in numbers
    assert events.sms_messages(destination=stopper, campaign=str(second)) == []
    assert statuses(s, second) == {"sent": USERS - 1}
    assert suppression(s, stopper) == (reason, source)  # the start-time sync kept the first
