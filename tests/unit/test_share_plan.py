"""The share plan: the lanes' budgets sum to the limit at every instant and within any hold,
each lane gets its proportional share over a cycle, the +1 rarely changes hands, and the
lanes of a low-rate campaign finish together."""

from __future__ import annotations

import math
import random

import pytest

from streams.rules.share_plan import MIN_CYCLE_S, share_plan
from streams.sender import HANDOFF_S, PLAN_HOLD_S, WINDOW_S

HOLD, AHEAD = PLAN_HOLD_S, HANDOFF_S
# How far apart the checks of calls SES accepts in one second may be: the second, the hand-off,
# 0.25 s from a check to SES accepting the request, 0.1 s between the workers' sending clocks.
SPREAD = WINDOW_S + HANDOFF_S + 0.25 + 0.1


def random_weights(rng: random.Random, partitions: int) -> list[int] | None:
    kind = rng.choice(["none", "even", "skewed", "zeros"])
    if kind == "none":
        return None
    if kind == "even":
        return [rng.randint(900, 1100) for _ in range(partitions)]
    weights = [rng.randint(0 if kind == "zeros" else 1, 5000) for _ in range(partitions)]
    weights[rng.randrange(partitions)] += 1  # never all zero
    return weights


@pytest.mark.parametrize("seed", range(40))
def test_budgets_sum_to_the_limit_at_every_instant(seed: int) -> None:
    rng = random.Random(seed)
    partitions = rng.randint(1, 16)
    rate = rng.choice([rng.uniform(1, 60), rng.uniform(20, 10_000)])
    plan = share_plan(rate, partitions, random_weights(rng, partitions))
    for _ in range(300):
        clock = rng.uniform(0, 5 * plan.cycle_s)
        budgets = [plan.budget_at(p, clock) for p in range(partitions)]
        assert min(budgets) >= 1
        assert sum(budgets) == max(math.floor(rate), partitions)


@pytest.mark.parametrize("seed", range(40))
def test_lanes_asking_within_a_hold_never_add_up_over_the_limit(seed: int) -> None:
    """The sender's bound: calls SES accepts in one second were checked under budgets asked
    within SPREAD of each other; each lane's least budget over its own [clock - hold,
    clock + ahead] then shares an instant with every other's."""
    rng = random.Random(seed)
    partitions = rng.randint(2, 16)
    rate = rng.choice([rng.uniform(partitions + 1, 60), rng.uniform(60, 5_000)])
    plan = share_plan(rate, partitions, random_weights(rng, partitions))
    for _ in range(400):
        x = rng.uniform(0, 3 * plan.cycle_s)
        clocks = [rng.uniform(x, x + SPREAD) for _ in range(partitions)]
        total = sum(plan.budget_over(p, c - HOLD, c + AHEAD) for p, c in enumerate(clocks))
        assert total <= math.floor(rate)


@pytest.mark.parametrize("rate", [20, 23, 37, 777])
def test_no_second_sees_a_moved_recipient_twice(rate: float) -> None:
    """Every instant of a cycle, 5 ms apart: over any SPREAD of checks, the most each lane
    could be given adds up to at most the limit (the giver's last +1 and the taker's first are
    further apart than SPREAD)."""
    weights = [43, 57, 50, 48, 61, 39, 52, 50, 47, 55, 49, 49]
    plan = share_plan(rate, 12, [w * rate for w in weights])
    step = 0.005
    n = int(plan.cycle_s / step) + 1
    span = int(SPREAD / step) + 1
    most = [0] * n
    for p in range(12):
        extra = [
            plan.budget_over(p, k * step - HOLD, k * step + AHEAD) - plan.base[p] for k in range(n)
        ]
        sums = [0]
        for e in extra:
            sums.append(sums[-1] + e)
        for k in range(n - span):
            most[k] += plan.base[p] + (1 if sums[k + span] > sums[k] else 0)
    assert max(most[: n - span]) <= math.floor(rate)


def test_a_budget_over_an_interval_is_its_least() -> None:
    plan = share_plan(20, 12, [50] * 12)
    for p in range(12):
        for step in range(400):
            start = step * plan.cycle_s / 400
            least = min(plan.budget_at(p, start + k * 0.05) for k in range(29))  # 1.4 s
            assert plan.budget_over(p, start, start + 1.4) <= least


@pytest.mark.parametrize(
    ("rate", "weights"),
    [
        (20, [43, 57, 50, 48, 61, 39, 52, 50, 47, 55, 49, 49]),
        (2_222, [1] * 12),
        (37, [1, 200, 300, 250]),
    ],
)
def test_each_lane_gets_its_proportional_share_over_a_cycle(
    rate: float, weights: list[int]
) -> None:
    plan = share_plan(rate, len(weights), weights)
    steps = 20_000
    dt = plan.cycle_s / steps
    totals = [
        sum(plan.budget_at(p, (k + 0.5) * dt) for k in range(steps)) * dt
        for p in range(len(weights))
    ]
    for p, total in enumerate(totals):
        expected = (plan.base[p] + plan.rem[p] / plan.unit) * plan.cycle_s
        assert total == pytest.approx(expected, abs=2 * dt * 2)
    if min(weights) * math.floor(rate) >= sum(weights):  # nobody held at 1/s
        for p, total in enumerate(totals):
            share = math.floor(rate) * weights[p] / sum(weights)
            assert total / plan.cycle_s == pytest.approx(share, rel=1e-3)


def test_the_extra_recipient_changes_hands_about_once_per_lane_per_cycle() -> None:
    plan = share_plan(20, 12, [43, 57, 50, 48, 61, 39, 52, 50, 47, 55, 49, 49])
    assert plan.cycle_s == pytest.approx(600 / 20)  # the campaign's planned duration
    changes = 0
    previous = [plan.budget_at(p, 0.0) for p in range(12)]
    for k in range(1, 30_000):
        now = [plan.budget_at(p, k * plan.cycle_s / 30_000) for p in range(12)]
        changes += sum(1 for a, b in zip(previous, now, strict=True) if a != b)
        previous = now
    assert changes <= 2 * 12 + 2


def test_lanes_of_a_low_rate_campaign_finish_together() -> None:
    """20/s over 12 partitions of uneven size, each lane sending its least budget over the
    hold: the campaign takes within 2 % of its planned duration. With a fixed integer share
    per lane (1 or 2/s here) it takes half as long again: 180 s for 120."""
    weights = [202, 214, 166, 225, 195, 147, 209, 180, 218, 159, 240, 243]  # 2 min at 20/s
    plan = share_plan(20, 12, weights)
    left = [float(w) for w in weights]
    clock, dt, last = 0.0, 0.01, 0.0
    while any(rest > 0 for rest in left):
        for p in range(12):
            if left[p] > 0:
                left[p] -= plan.budget_over(p, clock - HOLD, clock + AHEAD) * dt
                last = clock
        clock += dt
    assert sum(weights) / 20 / last >= 0.98


def test_shares_follow_the_partitions_recipients() -> None:
    weights = [4204, 4370, 4291, 4310, 0, 4285, 4258, 4321, 4322, 4313, 4289, 4297]
    plan = share_plan(777, 12, weights)
    means = [plan.base[p] + plan.rem[p] / plan.unit for p in range(12)]
    assert means[4] == 1  # no recipients: the floor of one
    assert means[1] == max(means) and means[0] == min(m for m in means if m > 1)
    assert share_plan(777, 12, list(weights)) == plan  # the same on every worker


def test_small_shares_get_one_and_the_rest_is_shared() -> None:
    plan = share_plan(100, 4, [1, 0, 500, 1500])
    assert plan.base[0] == 1 and plan.rem[0] == 0
    assert plan.base[1] == 1 and plan.rem[1] == 0
    assert plan.base[2] + plan.rem[2] / plan.unit == pytest.approx(98 * 500 / 2000)
    assert plan.base[3] + plan.rem[3] / plan.unit == pytest.approx(98 * 1500 / 2000)


def test_edges() -> None:
    assert [share_plan(0, 12).budget_at(p, 5.0) for p in range(12)] == [0] * 12  # unlimited
    assert [share_plan(5, 12).budget_at(p, 5.0) for p in range(12)] == [1] * 12  # floor of one
    assert share_plan(37, 12, [1, 2]).base == share_plan(37, 12).base  # weights not fitting
    assert share_plan(37, 12, [0] * 12).base == share_plan(37, 12).base
    assert share_plan(37, 12).cycle_s == MIN_CYCLE_S
    with pytest.raises(ValueError):
        share_plan(100, 0)
