"""The GCRA limiter of transactional mail and the AIMD controller of campaign lanes, checked by
simulating callers over simulated time.

Who uses what today: each mail worker paces its SendEmail calls with one `Gcra` (one recipient
per reservation, `mail_concurrency` callers, streams/mail_sender.py, configured by
streams/mail_app.sender_config); each campaign lane has a `WindowPacer` with an integer share
of the campaign limit (tests/unit/test_window_pacer.py) and an `Aimd` whose ceiling is
`split_rate` of it (streams/sender.py).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import pytest

from flashsend.settings import load_settings
from streams.mail_app import sender_config
from streams.rules.throttle import Aimd, Gcra, split_rate

Send = tuple[float, int]  # (send time, recipients)


def simulate(
    limiters: list[Gcra],
    callers_per_limiter: int,
    duration: float,
    batch: Callable[[random.Random], int],
    seed: int = 7,
) -> list[Send]:
    """Callers loop: reserve, sleep the delay, send, do a little work, reserve again."""
    rng = random.Random(seed)
    sends: list[Send] = []
    queue: list[tuple[float, int, int]] = []  # (time of next reserve, caller id, limiter index)
    for index in range(len(limiters)):
        for caller in range(callers_per_limiter):
            heapq.heappush(queue, (rng.uniform(0, 0.01), caller, index))
    while queue:
        now, caller, index = heapq.heappop(queue)
        if now >= duration:
            continue
        n = batch(rng)
        send_at = now + limiters[index].reserve(n, now)
        if send_at < duration:
            sends.append((send_at, n))
        heapq.heappush(queue, (send_at + rng.uniform(0.0, 0.004), caller, index))
    return sorted(sends)


def max_window(sends: list[Send], width: float = 1.0) -> int:
    """Largest number of recipients in any closed window [t, t + width]."""
    best = total = 0
    end = 0
    for start, (t0, _) in enumerate(sends):
        while end < len(sends) and sends[end][0] <= t0 + width:
            total += sends[end][1]
            end += 1
        best = max(best, total)
        total -= sends[start][1]
    return best


def full_batch(_: random.Random) -> int:
    return 50


def mixed_batch(rng: random.Random) -> int:
    return rng.randint(1, 50)


@pytest.mark.parametrize("batch", [full_batch, mixed_batch])
@pytest.mark.parametrize("rate", [50.0, 556.0, 1000.0])
def test_many_callers_one_limiter_stay_within_rate(
    rate: float, batch: Callable[[random.Random], int]
) -> None:
    duration = 60.0
    sends = simulate([Gcra(rate=rate, burst=50)], 16, duration, batch)
    assert max_window(sends) <= rate + 50
    average = sum(n for _, n in sends) / duration
    assert average == pytest.approx(rate, rel=0.02)


def mail_sends(limiter: Gcra, callers: int, busy: list[tuple[float, float]]) -> list[Send]:
    """Mail callers (one recipient per reservation) that have work only in the `busy` periods:
    a quiet spell refills the bucket, and the flood after it spends it at once."""
    sends: list[Send] = []
    for start, end in busy:
        queue = [(start + i * 1e-4, i) for i in range(callers)]
        heapq.heapify(queue)
        while queue:
            now, caller = heapq.heappop(queue)
            if now >= end:
                continue
            send_at = now + limiter.reserve(1, now)
            if send_at < end:
                sends.append((send_at, 1))
            heapq.heappush(queue, (send_at + 0.002, caller))
    return sorted(sends)


@pytest.mark.parametrize(("mail_rate", "reserve"), [(40.0, 50.0), (5.0, 6.0), (90.0, 100.0)])
def test_a_mail_worker_stays_within_the_transactional_reserve_in_every_second(
    mail_rate: float, reserve: float
) -> None:
    # The mail worker's limiter exactly as the mail app configures it: its burst is what the
    # reserve leaves above mail_rate, so even a flood after a quiet spell (a full bucket)
    # keeps every sliding second at SES within the reserve.
    settings = load_settings(mail_rate=mail_rate, transactional_reserve=reserve)
    config = sender_config(settings)
    limiter = Gcra(config.rate, burst=max(1, config.burst))
    sends = mail_sends(limiter, config.concurrency, [(0.0, 20.0), (40.0, 60.0)])
    assert max_window(sends) <= settings.transactional_reserve
    assert max_window(sends) > mail_rate  # the flood did spend the refilled bucket
    steady = [s for s in sends if 45.0 <= s[0] < 60.0]
    assert len(steady) / 15.0 == pytest.approx(mail_rate, rel=0.05)


def test_gcra_per_partition_lets_aligned_partitions_exceed_the_campaign_limit() -> None:
    # Why campaign lanes use a window budget and not one GCRA per partition: at 440/s each
    # partition (110/s) fits 3 full calls in one second, and four aligned partitions send 600.
    limiters = [Gcra(rate=split_rate(440.0, 4), burst=50) for _ in range(4)]
    sends = sorted((t, 50) for g in limiters for t in [g.reserve(50, 0.0) for _ in range(3)])
    assert max_window(sends) == 600


def test_new_limiter_starts_with_empty_bucket() -> None:
    limiter = Gcra(rate=100.0, burst=50)
    assert limiter.reserve(50, 1000.0) == 0.0  # first call goes at once...
    assert limiter.available(1000.0) == 0.0  # ...and leaves the bucket empty
    assert limiter.reserve(50, 1000.0) == pytest.approx(0.5)
    assert limiter.reserve(10, 1000.0) == pytest.approx(0.6)


def test_new_limiter_spaces_single_recipients_after_the_first() -> None:
    limiter = Gcra(rate=100.0, burst=50)
    delays = [limiter.reserve(1, 0.0) for _ in range(5)]
    assert delays == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])


def test_idle_limiter_refills_to_one_burst_only() -> None:
    limiter = Gcra(rate=100.0, burst=50)
    limiter.reserve(50, 0.0)
    assert limiter.available(3600.0) == 50.0
    assert [limiter.reserve(1, 3600.0) for _ in range(50)] == [0.0] * 50
    assert limiter.reserve(1, 3600.0) == pytest.approx(0.01)


def test_reserve_rejects_more_than_burst_and_ignores_zero() -> None:
    limiter = Gcra(rate=100.0, burst=50)
    with pytest.raises(ValueError):
        limiter.reserve(51, 0.0)
    with pytest.raises(ValueError):
        limiter.reserve(-1, 0.0)
    assert limiter.reserve(0, 0.0) == 0.0
    assert limiter.reserve(50, 0.0) == 0.0  # the zero reservation did not start the bucket
    with pytest.raises(ValueError):
        Gcra(rate=1.0, burst=0)


def test_set_rate_reprices_outstanding_without_burst() -> None:
    limiter = Gcra(rate=100.0, burst=50)
    limiter.reserve(50, 0.0)
    limiter.set_rate(200.0, 0.0)  # 50 recipients still owed, now worth 0.25 s
    assert limiter.available(0.0) == 0.0
    assert limiter.reserve(50, 0.0) == pytest.approx(0.25)
    # 100 owed (the bucket plus the call booked at 0.25 s) at 50/s: the next waits 2 s.
    limiter.set_rate(50.0, 0.0)
    assert limiter.reserve(50, 0.0) == pytest.approx(2.0)


def test_rate_change_mid_run_follows_each_rate() -> None:
    limiter = Gcra(rate=500.0, burst=50)
    sends: list[Send] = []
    now = 0.0
    while now < 60.0:
        if now >= 30.0 and limiter.rate == 500.0:
            limiter.set_rate(100.0, now)
        now += limiter.reserve(50, now)
        sends.append((now, 50))
    first = [s for s in sends if s[0] < 30.0]
    second = [s for s in sends if s[0] >= 30.0]
    assert max_window(first) <= 500 + 50
    assert max_window(second) <= 100 + 50
    assert sum(n for _, n in second) / 30.0 == pytest.approx(100.0, rel=0.02)


def test_unlimited_limiter_never_waits_and_limited_again_starts_empty() -> None:
    limiter = Gcra(rate=0.0)
    assert all(limiter.reserve(50, 0.0) == 0.0 for _ in range(1000))
    assert limiter.available(0.0) == float("inf")
    limiter.set_rate(100.0, 5.0)
    assert limiter.reserve(50, 5.0) == pytest.approx(0.5)
    limiter.set_rate(-1.0, 6.0)
    assert limiter.reserve(50, 6.0) == 0.0
    limiter.set_rate(100.0, 6.0)
    assert limiter.reserve(50, 6.0) == pytest.approx(0.5)


def test_rate_change_before_any_send_keeps_limiter_fresh() -> None:
    limiter = Gcra(rate=100.0, burst=50)
    limiter.set_rate(200.0, 0.0)
    assert limiter.reserve(50, 0.0) == 0.0
    assert limiter.reserve(50, 0.0) == pytest.approx(0.25)
    unlimited = Gcra(rate=0.0)
    unlimited.set_rate(100.0, 0.0)
    assert unlimited.reserve(50, 0.0) == 0.0


def test_split_rate() -> None:
    assert split_rate(556.0, 4) == 139.0
    assert split_rate(0.0, 4) == 0.0
    assert split_rate(-3.0, 4) == 0.0
    with pytest.raises(ValueError):
        split_rate(100.0, 0)


def test_aimd_halves_on_throttle_once_per_cooldown_and_floors() -> None:
    aimd = Aimd(ceiling=100.0, min_rate=10.0)
    assert aimd.rate == 100.0
    assert aimd.on_throttle(0.0) == 50.0
    assert aimd.on_throttle(0.5) == 50.0  # same spike, ignored
    assert aimd.on_throttle(1.0) == 25.0
    assert aimd.on_throttle(2.0) == 12.5
    assert aimd.on_throttle(3.0) == 10.0


def test_aimd_recovers_additively_to_ceiling() -> None:
    aimd = Aimd(ceiling=100.0)
    aimd.on_success(0.0)
    assert aimd.rate == 100.0
    aimd.on_throttle(10.0)
    assert aimd.on_success(15.0) == pytest.approx(75.0)  # +5 per second
    assert aimd.on_success(16.0) == pytest.approx(80.0)
    assert aimd.on_success(60.0) == 100.0


def test_aimd_drives_a_limiter() -> None:
    aimd = Aimd(ceiling=200.0)
    limiter = Gcra(rate=aimd.rate, burst=50)
    limiter.reserve(50, 0.0)
    limiter.set_rate(aimd.on_throttle(0.0), 0.0)
    assert limiter.reserve(50, 0.0) == pytest.approx(0.5)  # 50 owed at 100/s, then 50 more


def test_aimd_unlimited_ceiling_uses_measured_rate_then_returns_to_unlimited() -> None:
    aimd = Aimd(ceiling=0.0, quiet_period=60.0)
    assert aimd.rate == 0.0
    assert aimd.on_success(1.0) == 0.0
    assert aimd.on_throttle(10.0, measured_rate=400.0) == 200.0
    assert aimd.on_success(15.0) == pytest.approx(300.0)  # +5 % of 400 per second
    assert aimd.on_success(40.0) == 400.0  # back to where SES pushed back, not beyond
    assert aimd.on_success(69.0) == 400.0
    assert aimd.on_success(70.0) == 0.0  # quiet for 60 s: unlimited again


def test_aimd_unlimited_ceiling_without_measure_uses_fallback() -> None:
    aimd = Aimd(ceiling=0.0, fallback_rate=80.0)
    assert aimd.on_throttle(0.0) == 40.0
    assert aimd.on_throttle(5.0, measured_rate=1000.0) == 20.0  # already limited: just halve


def test_aimd_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        Aimd(ceiling=10.0, factor=1.0)
    with pytest.raises(ValueError):
        Aimd(ceiling=10.0, min_rate=0.0)
