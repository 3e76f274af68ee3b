"""A lane's pacer charged in SMS segments: rows of unequal cost, admitted as a prefix.

The bound is checked as in test_window_pacer: lanes simulated over simulated time, every
message accepted by the provider at any instant between its call's start and answer, and
the segments accepted in every half-open 1-second window summed at the provider's side.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsend.errors import UsageError
from flashsend.settings import Settings
from infra.ses_standin.faults import FaultConfig
from infra.ses_standin.sms import SmsAccount
from infra.ses_standin.stats import max_in_window
from producers.campaign_ops import create_campaign
from sinks.recipient_store import ClaimedRecipient, LiveCampaign
from streams.rules.share_plan import share_plan
from streams.rules.throttle import WindowPacer, affordable_rows
from streams.sms_channel import row_segments

SMS_CALL = 10


@given(st.lists(st.integers(0, 6), max_size=20), st.integers(0, 40))
def test_affordable_rows_is_the_longest_prefix_that_fits(costs: list[int], units: int) -> None:
    k = affordable_rows(costs, units)
    assert sum(costs[:k]) <= units
    assert k == len(costs) or sum(costs[: k + 1]) > units


def test_the_admitted_rows_are_the_prefix_whose_cost_fits_the_room() -> None:
    pacer = WindowPacer(10)
    assert pacer.admit_costs([3, 3, 3, 3], 0.0) == (3, 0.0)  # 9 of 10: the 4th does not fit
    pacer.started(9, 0.0)
    pacer.finished(9, 0.1)
    later = WindowPacer(10)
    later.started(6, 0.0)
    later.finished(6, 0.1)
    # Room 4 at t=1.0: half of the wanted 6 fits, so the call goes with the rows that fit.
    assert later.admit_costs([2, 2, 2], 1.0) == (2, 0.0)
    # Room 4 is less than the first row's 5: wait until the call's window ends (1.1 s).
    rows, wait = later.admit_costs([5, 1], 1.0)
    assert rows == 0 and wait == pytest.approx(0.1, abs=1e-6)


def test_a_row_dearer_than_the_whole_budget_goes_alone_once_the_window_is_empty() -> None:
    pacer = WindowPacer(2)
    assert pacer.admit_costs([3, 1], 0.0) == (1, 0.0)  # alone, though it is over the budget
    pacer.started(3, 0.0)
    assert pacer.admit_costs([3], 0.05)[0] == 0  # its call is out
    pacer.finished(3, 0.2)
    rows, wait = pacer.admit_costs([1], 0.5)
    assert rows == 0 and wait > 0.7  # nothing else until a window after its answer
    assert pacer.admit_costs([3], 1.0 + 0.2 + 0.5)[0] == 1  # and then it goes again


def test_rows_costing_nothing_always_go() -> None:
    pacer = WindowPacer(2)
    pacer.started(2, 0.0)
    assert pacer.admit_costs([0, 0], 0.01) == (2, 0.0)
    assert pacer.admit_costs([], 0.01) == (0, 0.0)


@given(
    st.lists(
        st.tuples(st.integers(1, 60), st.floats(0.0, 0.5), st.floats(0.0, 1.5)),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 40),
)
def test_with_every_cost_one_it_is_admit(
    steps: list[tuple[int, float, float]], budget: int
) -> None:
    """Costs of one unit each give exactly `admit`'s answers: the message path's pacing."""
    by_count, by_costs = WindowPacer(budget), WindowPacer(budget)
    now = 0.0
    for wanted, gap, latency in steps:
        now += gap
        answer = by_count.admit(wanted, now)
        assert by_costs.admit_costs([1] * wanted, now) == answer
        if answer[0]:
            for pacer in (by_count, by_costs):
                pacer.started(answer[0], now)
                pacer.finished(answer[0], now + latency)


def test_call_rows_fill_a_call_worth_of_segments() -> None:
    pacer = WindowPacer(30)  # a tick (0.2 s) of 30 is 6 units: 3 rows of 2 segments
    assert pacer.call_size(SMS_CALL) == 6
    assert pacer.call_rows([2] * 12, SMS_CALL) == 3
    assert pacer.call_rows([1] * 12, SMS_CALL) == pacer.call_size(SMS_CALL)
    # Rows not queued yet are priced like the dearest queued: a short queue still lingers.
    assert pacer.call_rows([2], SMS_CALL) == 3
    assert pacer.call_rows([9], SMS_CALL) == 1  # never less than one row
    assert WindowPacer(0).call_rows([3, 3], SMS_CALL) == SMS_CALL  # unlimited: a full call


def simulate_lane(
    pacer: WindowPacer, costs: list[int], rng: random.Random, latency: tuple[float, float]
) -> list[tuple[float, int]]:
    """One lane sending `costs` (one message each) call after call; each message accepted at
    a random instant of its call. Returns (accepted at, segments) per message."""
    accepted: list[tuple[float, int]] = []
    queue = list(costs)
    now = rng.uniform(0, 1)
    stalls = 0
    while queue:
        size = pacer.call_rows(queue, SMS_CALL)
        rows, wait = pacer.admit_costs(queue[:size], now)
        if not rows:
            assert wait > 0
            stalls += 1
            assert stalls < 10_000, "the lane never sends again"
            now += wait
            continue
        batch, queue = queue[:rows], queue[rows:]
        units = sum(batch)
        took = rng.uniform(*latency)
        if units:
            pacer.started(units, now)
        for cost in batch:
            if cost:
                accepted.append((now + rng.uniform(0, took), cost))
        if units:
            pacer.finished(units, now + took)
        now += took
    return accepted


@settings(max_examples=60, deadline=None)
@given(
    rate=st.integers(1, 400),
    partitions=st.integers(1, 12),
    dearest=st.integers(1, 6),
    slow=st.floats(0.001, 0.8),
    seed=st.integers(0, 2**32 - 1),
)
def test_no_window_at_the_provider_holds_more_segments_than_the_limit(
    rate: int, partitions: int, dearest: int, slow: float, seed: int
) -> None:
    """Any costs, latencies and limits: the segments accepted in any 1-second window stay
    within the campaign's limit, or, where a lane's share is below its dearest message,
    within that lane's one message per window (documented in admit_costs)."""
    rng = random.Random(seed)
    accepted: list[tuple[float, int]] = []
    bound = 0
    for p in range(partitions):
        budget = share_plan(rate, partitions).budget_at(p, 0.0)
        costs = [rng.choice([0, *range(1, dearest + 1)]) for _ in range(rng.randint(0, 120))]
        bound += max(budget, max(costs, default=0))
        accepted += simulate_lane(WindowPacer(budget), costs, rng, (0.0005, slow))
    accepted.sort()
    worst = max_in_window([t for t, _ in accepted], [n for _, n in accepted])
    assert worst <= bound
    if dearest <= min(share_plan(rate, partitions).budget_at(p, 0.0) for p in range(partitions)):
        assert worst <= max(rate, partitions)


def test_the_bound_fails_when_each_message_counts_one() -> None:
    """The same lanes charged one per message (the message rate) send 2-segment messages at
    about twice the limit in segments: the check above has teeth."""
    rng = random.Random(7)
    accepted: list[tuple[float, int]] = []
    for p in range(4):
        pacer = WindowPacer(share_plan(37, 4).budget_at(p, 0.0))
        for t, _ in simulate_lane(pacer, [1] * 200, rng, (0.01, 0.05)):
            accepted.append((t, 2))
    accepted.sort()
    assert max_in_window([t for t, _ in accepted], [n for _, n in accepted]) > 37 * 1.5


LONG_GSM = "Hi {{first_name}}, " + "the flash sale starts now, everything 50% off. " * 4
UCS2 = (
    "Chào {{first_name}}, giảm giá 50% hôm nay cho mọi sản phẩm trong cửa hàng, "
    "chỉ trong hai giờ tới!"
)


@pytest.mark.parametrize(
    ("template", "first_name", "phone", "segments"),
    [
        ("Hi {{first_name}}", "An", "+84912345678", 1),
        (LONG_GSM, "An", "+84912345678", 2),
        (LONG_GSM, "Bartholomew-Alexander" * 2, "+84912345678", 2),
        (UCS2, "An", "+84912345678", 2),
        (UCS2, "An" * 40, "+84912345678", 3),  # the name makes it a third segment
        (LONG_GSM, "An", "0912345678", 0),  # no country code: skipped, no request
    ],
)
def test_a_row_costs_the_segments_of_its_own_body(
    template: str, first_name: str, phone: str, segments: int
) -> None:
    campaign = LiveCampaign(1, "sending", 37, template, "+12065550100", None, "s", channel="sms")
    row = ClaimedRecipient(1, 1, 1, phone, first_name, attempt=1)
    assert row_segments(campaign, row) == segments


def test_segments_are_refused_for_an_email_campaign() -> None:
    # Refused before any connection: the settings point nowhere.
    unreachable = Settings(pg_dsn="postgresql://127.0.0.1:9/none")
    with pytest.raises(UsageError, match="--rate-unit segments is for SMS campaigns"):
        create_campaign(unreachable, name="x", rate=10, rate_unit="segments")
    with pytest.raises(UsageError, match="--rate-unit must be messages or segments"):
        create_campaign(unreachable, name="x", channel="sms", template="hi", rate_unit="parts")


def test_the_standin_counts_the_busiest_second_in_segments() -> None:
    config = FaultConfig()
    account = SmsAccount(lambda: config, lambda p: False)

    def text(n: int, body: str, at: float, campaign: str = "1") -> None:
        message = {
            "DestinationPhoneNumber": f"+8491234{n:04d}",
            "OriginationIdentity": "+12065550100",
            "MessageBody": body,
            "Context": {"campaign": campaign},
        }
        account.send_text(message, at)

    text(1, "x" * 400, 10.0)  # 3 segments
    text(2, "x" * 200, 10.5)  # 2
    text(3, "x", 11.2)  # 1
    text(4, "ệ" * 150, 11.4, campaign="2")  # UCS-2 150 units: 3
    one = account.stats("1")
    assert (one["max_1s_window"], one["max_1s_window_segments"], one["segments"]) == (2, 5, 6)
    both = account.stats(None)
    assert (both["max_1s_window"], both["max_1s_window_segments"]) == (3, 6)
