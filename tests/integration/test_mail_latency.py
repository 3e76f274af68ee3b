"""A running flash-sale campaign never holds an order confirmation back (short `mail bench`;
`flashsend mail bench --json` reports the latency figures)."""

from __future__ import annotations

from flashsend.lab.mail_bench import BenchOptions, percentile, run_bench
from tests.conftest import LocalStack
from tests.integration.mail_fixtures import mail_settings

CAMPAIGN_RATE = 600.0


def test_confirmation_latency_while_a_600_per_s_campaign_runs(stack: LocalStack) -> None:
    """Campaign workers at 600/s and the mail worker share the SES account (MaxSendRate =
    600 + the transactional reserve + 50) and this 2-core machine. Confirmations keep their
    own configuration set and rate share: every one is sent once, none is throttled (one
    attempt each), while the campaign sends — measured at the stand-in: the campaign had
    mail accepted in every second of the order window (a confirmation sent beside a campaign
    that is not sending proves nothing). How fast either goes is a benchmark figure
    (`flashsend mail bench --json`), not a promise of this test."""
    settings = mail_settings(stack)
    result = run_bench(
        settings,
        BenchOptions(
            orders=40,
            order_rate=8.0,
            campaign_rate=CAMPAIGN_RATE,
            users=30_000,
            timeout_s=120.0,
            ramp_timeout_s=45.0,
        ),
        log=lambda _m: None,
    )
    assert result["orders"] == 40
    assert result["mail_attempts_max"] == 1, result
    assert result["campaign_min_per_s_during_orders"] > 0, result  # sending all along
    # run_bench raises unless each order's address has exactly one message at the provider.


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([7.0], 99) == 7.0
