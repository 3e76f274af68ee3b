"""An SMS campaign limited in segments per second, on the real stack: the CLI creates it,
worker processes send it through the stand-in's pinpoint-sms-voice-v2 with real boto3, and
the limit is measured at the provider in every sliding second, counted in segments."""

from __future__ import annotations

import psycopg
import pytest

from flashsend.cli.entry import main
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings, settings_env
from producers.campaign import start_campaign
from sinks.users import fill_phones, seed_users
from tests.integration.campaign_helpers import admin, statuses, wait_finished
from tests.integration.ops_helpers import cli, last_json

# 190-209 GSM-7 septets with the seeded first names: 2 segments each.
LONG_GSM = (
    "Hi {{first_name}}, the flash sale starts now: everything in the shop is 50% off for the "
    "next two hours, shoes, coats and bags included. Show this text at the till or order "
    "online. Reply STOP to opt out."
)
# Vietnamese needs UCS-2: 165-184 UTF-16 units, 3 segments each.
UCS2 = (
    "Chào {{first_name}}, giảm giá 50% cho mọi sản phẩm trong hai giờ tới: giày, áo khoác và "
    "túi xách. Xuất trình tin nhắn này tại quầy hoặc đặt hàng trực tuyến. Trả lời STOP để hủy."
)


@pytest.mark.parametrize(
    ("body", "rate", "segments"),
    [(LONG_GSM, 37, 2), (UCS2, 53, 3)],
    ids=["gsm-2-segments", "ucs2-3-segments"],
)
def test_a_segment_rate_holds_at_the_provider_in_every_second(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    body: str,
    rate: int,
    segments: int,
) -> None:
    """`--rate-unit segments`: the busiest sliding second at the provider holds at most the
    rate in segments (x 1.02, as the other limiter tests), while messages of 2-3 segments
    each would have let 2-3 times that through when counted one per message; every
    recipient is texted once."""
    seed_users(settings.pg_dsn, 160)
    fill_phones(settings.pg_dsn, 160)
    code, out = cli(
        settings,
        monkeypatch,
        capsys,
        *("campaign", "create", "--name", "segments", "--channel", "sms", "--body", body),
        *("--rate", str(rate), "--rate-unit", "segments"),
    )
    assert code == 0, out
    cid = int(out.strip())
    pool = WorkerPool(settings, settings.state_dir / f"logs-segments-{cid}")
    pool.start(1)
    try:
        start_campaign(settings, cid)
        wait_finished(settings, cid, pool, timeout=120)
    finally:
        pool.stop()

    stats = admin(settings).sms_stats(str(cid))
    messages = admin(settings).sms_messages(campaign=str(cid))
    assert {m["segments"] for m in messages} == {segments}, stats
    assert stats["duplicates"] == 0, stats
    assert stats["max_1s_window_segments"] <= rate * 1.02, stats
    st = statuses(settings, cid)
    for status in ("pending", "sending", "unknown", "failed"):
        assert st.get(status, 0) == 0, st
    assert st["sent"] == stats["accepted"] == len(messages) > 120, (st, stats)

    code, out = cli(settings, monkeypatch, capsys, "campaign", "status", str(cid), "--json")
    assert code == 0
    shown = last_json(out)
    assert (shown["rate_limit"], shown["rate_unit"]) == (rate, "segments")
    code, out = cli(settings, monkeypatch, capsys, "campaign", "status", str(cid))
    assert f"(limit {float(rate)} segments/s)" in out, out


def test_segments_are_refused_for_email_and_stored_for_sms_only(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with monkeypatch.context() as m:
        for key, value in settings_env(settings).items():
            m.setenv(key, value)
        capsys.readouterr()
        code = main(["campaign", "create", "--name", "mail", "--rate-unit", "segments"])
        err = capsys.readouterr().err
    assert code == 2
    assert "--rate-unit segments is for SMS campaigns (add --channel sms)" in err, err
    code, out = cli(
        settings,
        monkeypatch,
        capsys,
        *("campaign", "create", "--name", "sms", "--channel", "sms", "--body", "hi"),
    )
    assert code == 0
    sms = int(out.strip())
    code, out = cli(settings, monkeypatch, capsys, "campaign", "report", str(sms))
    assert code == 0 and f"{settings.default_rate:g}" in out and "messages/s" in out, out
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT name, channel, rate_unit FROM campaigns").fetchall()
        assert rows == [("sms", "sms", "messages")]  # the refused one wrote nothing
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO campaigns (name, template, from_address, audience_condition, "
                "rate_unit) VALUES ('m', 't', 'a@b.test', 'true', 'segments')"
            )
        conn.execute("UPDATE campaigns SET rate_unit = 'segments' WHERE id = %s", (sms,))
