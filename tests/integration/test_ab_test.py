"""A/B test, then the winner, on the real stack: the stored assignment, the holdout held until
a winner exists, `campaign promote` (twice at once), cancel during the holdout, and the
automatic winner from Click events that travel stand-in → SNS → webhook → mail.events →
feedback worker. What each destination got is read at the SES stand-in."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from flashsend.deliverability import feedback_app_id
from flashsend.errors import UsageError
from flashsend.lab.feedback_run import WebhookProcess, insert_users, wait_for, with_feedback
from flashsend.lab.workers import WorkerPool, wait_joined
from flashsend.settings import Settings
from infra.ses_standin.events_admin import SesEventsAdmin
from producers.campaign import snapshot, start_campaign
from producers.campaign_ops import AbTest, create_campaign, promote
from producers.reconcile import Reconciler
from sinks.campaign_store import CampaignStore
from sinks.ses import SesSender, make_client
from sinks.variant_store import VariantStore, variants_summary
from streams.rules.ab_test import Variant, variant_for
from tests.integration.campaign_helpers import admin, progress, statuses, wait_finished

USERS = 3_000


def _templates(settings: Settings) -> tuple[str, str]:
    """Two templates of this test's own (the stand-in's engagement is set per template)."""
    suffix = uuid.uuid4().hex[:6]
    names = (f"ab_a_{suffix}", f"ab_b_{suffix}")
    ses = SesSender(make_client(settings, timeout=10))
    for name in names:
        ses.put_template(name, f"{name}: {{{{first_name}}}}", "<p>sale</p>", "sale")
    return names


def _campaign(settings: Settings, winner_by: str = "manual", wait_s: float = 3600) -> int:
    a, b = _templates(settings)
    insert_users(settings, USERS, f"ab-{uuid.uuid4().hex[:6]}.flashsend.test")
    ab = AbTest([Variant("A", a, 10), Variant("B", b, 20)], wait_s, winner_by)
    return create_campaign(settings, name="ab", template=a, rate=0, ab=ab)


def _rows(settings: Settings, cid: int) -> list[tuple[int, str, str | None, str]]:
    with psycopg.connect(settings.pg_dsn) as conn:
        return [
            (int(u), str(e), v, str(s))
            for u, e, v, s in conn.execute(
                "SELECT user_id, email, variant, status FROM campaign_recipients "
                "WHERE campaign_id = %s",
                (cid,),
            )
        ]


def _templates_at_ses(settings: Settings, cid: int) -> dict[str, str]:
    """Destination → the template SES was asked to send it (each destination once)."""
    got: dict[str, str] = {}
    for m in admin(settings).messages(campaign=str(cid), limit=10 * USERS):
        for destination in m["destination"]:
            assert destination not in got, f"{destination} mailed twice"
            got[destination] = m["template"]
    return got


def _test_share_sent(settings: Settings, cid: int) -> dict[str, int]:
    def settled() -> dict[str, int] | None:
        counts = statuses(settings, cid)
        done = not counts.get("pending") and not counts.get("sending")
        return counts if done and counts.get("sent") else None

    return wait_for("the test share sent", settled, 90, 0.2)


def _wait_done(settings: Settings, cid: int) -> None:
    wait_for("campaign done", lambda: progress(settings, cid)["status"] == "done", 30, 0.2)


def test_assignment_is_stored_at_snapshot_by_the_stable_hash(settings: Settings) -> None:
    cid = _campaign(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        snapshot(conn, cid, settings.audience_condition)
        state = VariantStore(conn).state(cid)
    assert state is not None
    rows = _rows(settings, cid)
    assert len(rows) == USERS
    for user_id, _email, variant, status in rows:
        assert variant == variant_for(cid, user_id, state.variants), (user_id, variant)
        assert status == ("held" if variant is None else "pending")
    shares = Counter(v for _, _, v, _ in rows)
    assert abs(shares["A"] / USERS - 0.10) < 0.02, shares
    assert abs(shares["B"] / USERS - 0.20) < 0.02, shares
    assert statuses(settings, cid)["held"] == shares[None]  # the counters agree with the rows


def test_holdout_waits_and_promote_sends_it_the_winners_template(
    settings: Settings, tmp_path: Path
) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    cid = _campaign(s)
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        start_campaign(s, cid)
        counts = _test_share_sent(s, cid)
        time.sleep(3)  # reconcile ticks: nothing more is produced, the campaign is not done
        assert statuses(s, cid) == counts
        assert progress(s, cid)["status"] == "sending"
        rows = _rows(s, cid)
        held = {e for _, e, v, st in rows if st == "held"}
        assert held and len(held) == counts["held"]
        assert not held & set(_templates_at_ses(s, cid)), "a held recipient was mailed"

        outcomes: list[str] = []

        def promote_b() -> None:
            try:
                outcomes.append(promote(s, cid, "B"))
            except UsageError as exc:
                outcomes.append(f"refused: {exc}")

        racers = [threading.Thread(target=promote_b) for _ in range(2)]
        for t in racers:
            t.start()
        for t in racers:
            t.join()
        assert sorted(o.startswith("refused") for o in outcomes) == [False, True], outcomes
        final = wait_finished(s, cid, pool, timeout=90)
        _wait_done(s, cid)  # a worker's reconcile: nothing pending, sending or held
    finally:
        pool.stop()
    with psycopg.connect(s.pg_dsn) as conn:
        state = VariantStore(conn).state(cid)
        summary = variants_summary(VariantStore(conn), cid)
    assert state is not None and state.winner == "B"
    template = {"A": state.template_of("A"), "B": state.template_of("B")}
    at_ses = _templates_at_ses(s, cid)
    by_variant = {e: v for _, e, v, _ in _rows(s, cid)}
    initial = {e: v for _, e, v, st in rows if v is not None}
    for email, sent_template in at_ses.items():
        expected = template[initial.get(email, "B")]  # the holdout got the winner's
        assert sent_template == expected, (email, sent_template)
        assert by_variant[email] == initial.get(email, "B")
    assert held <= set(at_ses)
    assert summary is not None
    assert sum(v["sent"] for v in summary["variants"]) == final["sent"] == len(at_ses)


def test_cancel_during_the_holdout_sends_nothing_more(settings: Settings, tmp_path: Path) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    cid = _campaign(s)
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        start_campaign(s, cid)
        counts = _test_share_sent(s, cid)
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).transition(cid, "cancelled", "test cancel")
        with pytest.raises(UsageError, match="cancelled"):
            promote(s, cid, "A")
        with Reconciler(s) as reconciler:
            reconciler.reconcile(cid)
        time.sleep(2)
    finally:
        pool.stop()
    after = statuses(s, cid)
    assert after.get("held", 0) == 0
    assert after["cancelled"] == counts["held"]
    assert after["sent"] == counts["sent"] == len(_templates_at_ses(s, cid))


def test_the_automatic_winner_comes_from_click_events(settings: Settings, tmp_path: Path) -> None:
    """The stand-in makes B's template clicked by 30 % of its recipients and A's by 2 %; the
    workers' reconcile picks B once the holdout wait is over, and the holdout gets B."""
    s = with_feedback(
        settings,
        reconcile_interval_s=1.0,
        ses_event_types=("Delivery", "Bounce", "Complaint", "Open", "Click"),
    )
    assert s.ses_endpoint_url
    events = SesEventsAdmin(s.ses_endpoint_url)
    cid = _campaign(s, winner_by="clicks", wait_s=15)
    with psycopg.connect(s.pg_dsn) as conn:
        state = VariantStore(conn).state(cid)
    assert state is not None
    events.set_engagement(state.template_of("A"), p_open=0.2, p_click=0.02)
    events.set_engagement(state.template_of("B"), p_open=0.5, p_click=0.3)
    webhook = WebhookProcess.start(s, tmp_path)
    sub = events.subscribe(
        webhook.sns_url,
        s.sns_topic_arns[0],
        configuration_sets=[s.marketing_configuration_set],
        event_types=["Delivery", "Open", "Click"],
        signature_version=2,
    )
    feedback = WorkerPool(s, tmp_path, role="feedback")
    senders = WorkerPool(s, tmp_path)
    try:
        events.wait_confirmed(sub["id"])
        feedback.start(1)
        senders.start(1)
        wait_joined(s, 1)  # the wait runs from the snapshot: the test share must go at once
        # and its clicks must be applied before the wait is over
        wait_joined(s, 1, group_id=feedback_app_id(s))
        start_campaign(s, cid)
        final = wait_finished(s, cid, senders, timeout=120)
        _wait_done(s, cid)
    finally:
        senders.stop()
        feedback.stop()
        webhook.stop()
        events.unsubscribe(sub["id"])
    with psycopg.connect(s.pg_dsn) as conn:
        summary = variants_summary(VariantStore(conn), cid)
    assert summary is not None
    assert summary["winner"] == "B", summary
    assert summary["winner_reason"].startswith("auto: clicks rate"), summary
    a, b = summary["variants"]
    assert b["clicked"] > a["clicked"] > 0 and b["opened"] > 0 and a["delivered"] > 0, summary
    assert sum(v["sent"] for v in summary["variants"]) == final["sent"]
    at_ses = _templates_at_ses(s, cid)
    holdout = {e for _, e, v, _ in _rows(s, cid) if v == "B"} - {
        e for u, e, _, _ in _rows(s, cid) if variant_for(cid, u, state.variants) == "B"
    }
    assert holdout and {at_ses[e] for e in holdout} == {state.template_of("B")}
