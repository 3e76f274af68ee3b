"""The whole loop on the real stack: the SES stand-in publishes its events (signed SNS) to a real
`flashsend webhook` process, which puts them on mail.events; a real feedback worker settles the
rows in doubt; `flashsend campaign resend-unknown` queues again exactly the rest, once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flashsend.cli.entry import main
from flashsend.lab.feedback_run import WebhookProcess, feedback_lag, insert_users, with_feedback
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings, settings_env
from infra.ses_standin.events_admin import SesEventsAdmin
from producers.campaign import start_campaign
from producers.campaign_ops import create_campaign
from tests.integration.campaign_helpers import put_template, sql, statuses, wait_finished
from tests.integration.campaign_helpers import recipient_rows as rows
from tests.integration.ops_helpers import audit_rows, cli, last_json

USERS = 60
ACCEPTED_IN_DOUBT = list(range(1, 21))  # SES took them; the answer was lost
NEVER_CALLED = list(range(55, 61))  # claimed an hour ago, never reached SES
RECENT = 53  # never reached SES either, but within the grace


@pytest.fixture
def loop(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, SesEventsAdmin]]:
    """Own configuration set, SNS topic and webhook process, subscribed to every event type."""
    s = with_feedback(settings)
    assert s.ses_endpoint_url
    events = SesEventsAdmin(s.ses_endpoint_url)
    webhook = WebhookProcess.start(s, tmp_path)
    sub = events.subscribe(
        webhook.sns_url, s.sns_topic_arns[0], configuration_sets=[s.marketing_configuration_set]
    )
    try:
        events.wait_confirmed(sub["id"])
        yield s, events
    finally:
        events.unsubscribe(sub["id"])
        webhook.stop()


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(0.3)


def copies_at_ses(events: SesEventsAdmin, cid: int, email: str) -> int:
    """Messages of this campaign the stand-in accepted for this address."""
    found = events.messages(destination=email, limit=50)
    return sum(1 for m in found if m.get("tags", {}).get("campaign") == str(cid))


def test_events_settle_the_accepted_rows_and_resend_unknown_sends_only_the_rest_once(
    loop: tuple[Settings, SesEventsAdmin],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s, events = loop
    insert_users(s, USERS, f"r{uuid.uuid4().hex[:8]}.test")
    put_template(s)
    cid = create_campaign(s, name="in-doubt", rate=0)
    start_campaign(s, cid)
    sql(
        s,
        "UPDATE campaign_recipients SET status = 'unknown', reason = 'lease_expired', "
        "claimed_at = now() - interval '1 hour' WHERE campaign_id = %s AND seq = ANY(%s)",
        cid,
        NEVER_CALLED,
    )
    sql(
        s,
        "UPDATE campaign_recipients SET status = 'unknown', reason = 'lease_expired', "
        "claimed_at = now() WHERE campaign_id = %s AND seq = %s",
        cid,
        RECENT,
    )
    senders = WorkerPool(s, tmp_path)
    feedback = WorkerPool(s, tmp_path, role="feedback")
    try:
        senders.start(1)
        wait_finished(s, cid, senders)
        sent = rows(s, cid)
        assert all(sent[q][0] == "sent" for q in ACCEPTED_IN_DOUBT), sent
        # The answers of 20 accepted entries are lost: their rows are unknown, as a lease
        # expiry makes them. Their SES events wait in mail.events: no feedback worker yet.
        sql(
            s,
            "UPDATE campaign_recipients SET status = 'unknown', reason = 'lease_expired', "
            "message_id = NULL, sent_at = NULL, claimed_at = now() - interval '1 hour' "
            "WHERE campaign_id = %s AND seq = ANY(%s)",
            cid,
            ACCEPTED_IN_DOUBT,
        )
        assert statuses(s, cid) == {"sent": 33, "unknown": 27}
        wait_for("their events are on mail.events", lambda: feedback_lag(s) >= 2 * 53, 60)
        # Resending now would mail those 20 twice: refused while their events are unapplied.
        before = rows(s, cid)
        with monkeypatch.context() as m:
            for key, value in settings_env(s).items():
                m.setenv(key, value)
            capsys.readouterr()
            argv = ["campaign", "resend-unknown", str(cid), "--older-than", "10m", "--yes"]
            code = main([*argv, "--wait-feedback", "1"])
            err = capsys.readouterr().err
        assert code == 2 and "the feedback agent still has" in err, err
        assert rows(s, cid) == before and audit_rows(s, "unknown_resends") == []

        feedback.start(1)
        wait_for(
            "events settle the accepted rows",
            lambda: statuses(s, cid) == {"sent": 53, "unknown": 7},
            120,
        )
        wait_for("the feedback worker caught up", lambda: feedback_lag(s) == 0, 60)
        after = rows(s, cid)
        for q in ACCEPTED_IN_DOUBT:
            assert after[q][:3] == ("sent", "resolved_by_event", sent[q][2]), (q, after[q])
        for q in set(sent) - set(ACCEPTED_IN_DOUBT):
            assert after[q] == sent[q], q  # a sent row's own events change nothing
        assert {q for q, r in after.items() if r[0] == "unknown"} == {RECENT, *NEVER_CALLED}

        code, out = cli(s, monkeypatch, capsys, "campaign", "report", str(cid), "--json")
        assert code == 0
        in_doubt = last_json(out)["in_doubt"]
        assert (in_doubt["resolved_sent"], in_doubt["still_unknown"]) == (20, 7), in_doubt

        wait_for("the campaign is done", lambda: _status(s, cid) == "done", 30)
        # Dry run: says what, changes nothing.
        before = rows(s, cid)
        code, out = cli(
            s, monkeypatch, capsys, "campaign", "resend-unknown", str(cid), "--older-than", "10m"
        )
        assert code == 0, out
        assert "6 row(s) still unknown" in out and "dry run: nothing changed" in out, out
        code, out = cli(
            s,
            monkeypatch,
            capsys,
            *("campaign", "resend-unknown", str(cid), "--older-than", "10m", "--json"),
        )
        plan = last_json(out)
        assert [r["seq"] for r in plan["sample"]] == NEVER_CALLED
        assert plan["unknown_older"] == 6 and plan["dry_run"] is True
        assert rows(s, cid) == before
        assert audit_rows(s, "unknown_resends") == []

        code, out = cli(
            s,
            monkeypatch,
            capsys,
            *("campaign", "resend-unknown", str(cid), "--older-than", "10m", "--yes", "--json"),
            *("--reason", "test: SES outage"),
        )
        assert code == 0, out
        done = last_json(out)
        assert (done["moved"], done["produced"]) == (6, 6), done
        wait_finished(s, cid, senders)
        wait_for("the campaign is done again", lambda: _status(s, cid) == "done", 30)
    finally:
        senders.stop()
        feedback.stop()

    final = rows(s, cid)
    assert statuses(s, cid) == {"sent": 59, "unknown": 1}
    assert final[RECENT][:2] == ("unknown", "lease_expired")
    for q in NEVER_CALLED:
        assert final[q][0] == "sent", (q, final[q])
    # Every address of the campaign reached SES exactly once, except the one still in doubt.
    copies = {q: copies_at_ses(events, cid, str(final[q][3])) for q in final}
    assert copies == {q: 0 if q == RECENT else 1 for q in final}, copies
    [audit] = audit_rows(s, "unknown_resends")
    assert (audit["campaign_id"], audit["campaign_status"], audit["recipients"]) == (
        cid,
        "done",
        6,
    )
    assert audit["seqs"] == NEVER_CALLED and audit["reason"] == "test: SES outage"
    assert audit["older_than_s"] == 600


def _status(settings: Settings, cid: int) -> str:
    return str(sql(settings, "SELECT status FROM campaigns WHERE id = %s", cid)[0][0])
