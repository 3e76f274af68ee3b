"""Recipient-rate limiting: a sliding-window budget per campaign lane, a GCRA limiter for
transactional mail, and an AIMD controller driven by SES throttles.

Why per recipient: SES counts its quota in recipients, not API calls; one SendBulkEmail of 50
entries costs 50. SES enforces MaxSendRate per second, so the promise is about ANY sliding
1-second window at SES, not an average.

Why a window budget per partition for campaigns (`WindowPacer`, and `streams.rules.share_plan` for
the shares): whoever owns a Kafka partition owns an integer share of the campaign limit, the
shares sum to the limit at every instant, and each lane keeps its accepted recipients within
its share (plus a slack of at most 2 % for its call latency) in every sliding second whatever
the call latencies, so the sum over partitions holds with no shared counter. Spacing calls at
n/rate (or GCRA, whose bound is R + P * burst over P partitions) lets one extra call per lane
into a window as soon as latencies vary, and P lanes add those up.

Why GCRA for transactional mail: one limiter per worker, where a smooth token bucket with
sub-second resolution is the right shape (a fixed window lets 2x the limit through one sliding
second: two windows' worth either side of a boundary).

Everything here is pure: time comes in as `now` (monotonic seconds), nothing sleeps.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

# Float sums of 1/rate drift by picoseconds; a delay this small is noise, not a wait.
_EPSILON = 1e-9
# Weight of the newest call in the pacer's smoothed latency: one slow call moves the call
# size a little, a slow SES within a few calls.
_LATENCY_WEIGHT = 0.25


def split_rate(total_rate: float, partitions: int) -> float:
    """Per-partition share of a campaign rate: R / P; 0 (or less) stays 0 = unlimited."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if total_rate <= 0:
        return 0.0
    return total_rate / partitions


@dataclass
class Gcra:
    """GCRA limiter counted in recipients.

    `rate` is recipients per second (<= 0 means unlimited); `burst` is the bucket depth in
    recipients and also the largest single reservation (one SES call = 50).

    A new limiter starts with an EMPTY bucket: its first reservation is admitted at once (so a
    freshly assigned partition makes progress immediately) and leaves the bucket empty, so the
    following ones are spaced at `n / rate`. This is what a worker taking a partition over after a
    rebalance needs: the previous owner may have just spent the whole bucket.

    Change the rate only through `set_rate`, which keeps the number of outstanding recipients
    (it rescales the debt instead of resetting it, so a change never creates a burst).
    """

    rate: float
    burst: int = 50
    _tat: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")

    @property
    def unlimited(self) -> bool:
        return self.rate <= 0

    def reserve(self, n: int, now: float) -> float:
        """Book `n` recipients and return how long the caller must wait before sending them.

        The booking is made immediately, so concurrent callers each get their own slot; a caller
        that sleeps the returned delay and then sends stays within the rate. Raises ValueError
        for `n > burst`: such a call could never fit in the bucket and would break the bound.
        The bound holds for the booked send times: a caller that oversleeps (a blocked event
        loop) sends late and may bunch with later bookings; a caller that books and then does
        not send (campaign paused) just wastes its slot, which errs on the slow side.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n == 0:
            return 0.0
        if self.unlimited:
            self._tat = now  # only remembers that something was sent (see set_rate)
            return 0.0
        if n > self.burst:
            raise ValueError(f"cannot reserve {n} recipients with burst {self.burst}")
        interval = 1.0 / self.rate
        tau = self.burst * interval  # bucket depth expressed in seconds of debt
        cost = n * interval
        if self._tat is None:
            # Fresh limiter: admit this call now and leave the bucket empty after it.
            self._tat = now + tau
            return 0.0
        # Admissible once the debt still outstanding plus this cost fits into the bucket.
        send_at = self._tat + cost - tau
        if send_at - now <= _EPSILON:
            send_at = now
        self._tat = max(self._tat, send_at) + cost
        return send_at - now

    def set_rate(self, rate: float, now: float) -> None:
        """Change the rate without a burst.

        Outstanding recipients (admitted but not yet paid for) are kept and repriced at the new
        rate. Going from unlimited to limited after sending starts with an empty bucket, because
        an unlimited limiter does not know how much was just sent. A limiter that has admitted
        nothing yet stays fresh. Reservations already handed out keep their delay: a lowered
        rate applies from the next reservation on.
        """
        old = self.rate
        self.rate = rate
        if self._tat is None or rate <= 0:
            return
        if old <= 0:
            self._tat = now + self.burst / rate
            return
        outstanding = max(0.0, self._tat - now) * old  # recipients not yet paid for
        self._tat = now + outstanding / rate

    def available(self, now: float) -> float:
        """Recipients that could be admitted at `now` without waiting (inf when unlimited)."""
        if self.unlimited:
            return float("inf")
        if self._tat is None:
            return float(self.burst)
        debt = max(0.0, self._tat - now) * self.rate
        return max(0.0, self.burst - debt)


@dataclass
class Aimd:
    """Additive-increase / multiplicative-decrease of the effective rate, driven by SES throttles.

    Why: the configured rate is a ceiling we believe SES accepts; when SES answers with a throttle
    (HTTP 429, ACCOUNT_THROTTLED) the account is busier than we think (transactional traffic,
    other campaigns), so we back off multiplicatively and creep back linearly.

    - `on_throttle(now)`: rate *= `factor` (floored at `min_rate`). Throttles within `cooldown`
      seconds of the previous decrease are ignored: one overload spike usually throttles every
      call in flight, and halving once per call would collapse the rate to the floor.
    - `on_success(now)`: rate += `increase` x reference x seconds since the last change, capped at
      the reference. With a configured ceiling the reference is the ceiling (default: +5 % of the
      ceiling per second, so about 10 s from half rate back to full).

    Unlimited ceiling (`ceiling <= 0`): the rate stays 0 (= unlimited) until a throttle. The first
    throttle takes `measured_rate` (what the caller observed it was sending) when given, else
    `fallback_rate`, as the reference, and starts at reference x `factor`. Successes climb back to
    the reference (not beyond: that is where SES pushed back) and, once `quiet_period` seconds have
    passed since the last throttle, the next `on_success` returns the controller to unlimited.

    Apply the result with `Gcra.set_rate(aimd.rate, now)`; both methods return the new rate.
    """

    ceiling: float
    factor: float = 0.5
    min_rate: float = 1.0
    increase: float = 0.05
    cooldown: float = 1.0
    fallback_rate: float = 100.0
    quiet_period: float = 60.0
    _rate: float = field(default=0.0, init=False, repr=False)
    _reference: float = field(default=0.0, init=False, repr=False)
    _last_change: float | None = field(default=None, init=False, repr=False)
    _last_throttle: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.factor < 1:
            raise ValueError(f"factor must be in (0, 1), got {self.factor}")
        if self.min_rate <= 0:
            raise ValueError(f"min_rate must be > 0, got {self.min_rate}")
        self._rate = max(0.0, self.ceiling)
        self._reference = self._rate

    @property
    def rate(self) -> float:
        """Effective rate in recipients/s; 0 means unlimited."""
        return self._rate

    def on_throttle(self, now: float, measured_rate: float | None = None) -> float:
        """Record a throttle at `now`; `measured_rate` only matters when currently unlimited."""
        if self._last_throttle is not None and now - self._last_throttle < self.cooldown:
            return self._rate
        if self._rate <= 0:  # only reachable with an unlimited ceiling
            if measured_rate is not None and measured_rate > 0:
                self._reference = measured_rate
            else:
                self._reference = self.fallback_rate
            new_rate = self._reference * self.factor
        else:
            new_rate = self._rate * self.factor
        self._rate = max(self.min_rate, new_rate)
        self._last_change = now
        self._last_throttle = now
        return self._rate

    def on_success(self, now: float) -> float:
        """Record a successful call at `now` and grow the rate back towards the reference."""
        if self._rate <= 0 or self._last_change is None or self._last_throttle is None:
            return self._rate
        if self.ceiling <= 0 and now - self._last_throttle >= self.quiet_period:
            self._rate = 0.0
            self._last_change = now
            return self._rate
        elapsed = max(0.0, now - self._last_change)
        self._rate = min(self._reference, self._rate + self.increase * self._reference * elapsed)
        self._last_change = now
        return self._rate


def affordable_rows(costs: Sequence[int], units: int) -> int:
    """How many of `costs`, taken in order, fit in `units`: the longest prefix whose sum is
    at most `units` (a row never splits: a call holds whole messages)."""
    total = 0
    for i, cost in enumerate(costs):
        total += cost
        if total > units:
            return i
    return len(costs)


def takeover_hold_until(assigned_at: float, sendable_since: float | None, window_s: float) -> float:
    """Until when a partition's new owner counts a campaign's window as full: `window_s`
    after the assignment (the previous owner may have spent the budget in the second before
    it), unless the campaign's rows became sendable only after the assignment, when nobody
    can have sent any of them (`sendable_since` None: not known, so held)."""
    if sendable_since is not None and sendable_since > assigned_at:
        return float("-inf")
    return assigned_at + window_s


@dataclass
class WindowPacer:
    """A sliding-window budget for one sender lane: whatever the calls' latencies, the
    recipients of this lane that SES accepts in any 1-second window are at most `budget`
    (with `slack`, at most budget x (1 + slack): see below).

    A call counts against the window from the moment it is admitted until `window_s` after its
    answer came back. SES accepts a call somewhere between those two instants, so any two
    calls SES accepts less than a second apart were both counted when the later one was
    admitted: the bound holds by construction, not by spacing calls and hoping. The price is
    the call's latency: a window holding `budget` sends it per (window + latency).

    A lane may ask `admit` a little ahead of the room (`ahead`: its database round trip and
    event-loop lateness come before the room instead of after it, where they would add to the
    latency paid for in the window); `until_free` right before the request then waits until
    the room is there, so the bound is kept by the check, not by the forecast.

    `hold_until(t)` makes the window count as full until `t`: a partition just taken over
    from another worker may have had its whole budget spent by that worker in the last second.

    Calls are sized to a `tick_s` worth of budget (between 1 and the SES maximum) and take
    turns on a grid (a call of n takes n / budget of the second; see `started`), so a lane
    spreads its budget over the second instead of spending it in a burst at the start of every
    window: bursts from every lane at once queue at SES, and each call's latency is paid for in
    the window. When calls are slow, a call carries the budget of twice the recent latency
    instead: with one call at a time, tick-sized calls would leave the lane waiting on answers
    with budget to spare, and calls of twice the latency reach the bound's budget per (window
    + latency) whenever they fit in one SES call. When the window has room for at least half a
    call but not a whole one, the call shrinks to the room.

    Counted in recipients (messages), or in segments for an SMS campaign limited in segments:
    there a row costs its message's segments (`admit_costs`, `call_rows`), and `budget`,
    `started` and `finished` are in segments.

    The window may hold a little more than the budget: `slack` (a fraction of it), and no
    more than the lane's recent call latency costs it (latency / window). A lane whose window
    holds `budget` sends budget / (1 + latency) per second, because a call counts from its
    request to a second after its answer; with real SES latencies (tens of milliseconds)
    that is several percent under the limit. The grid still spaces calls at the budget, so
    the sustained rate stays the limit, while any one second at SES holds at most
    budget x (1 + slack), whenever SES accepts each call. `slack` 0 is the strict bound.

    `budget <= 0` means unlimited. Pure: time comes in as `now`, nothing sleeps.
    """

    budget: int
    window_s: float = 1.0
    tick_s: float = 0.2
    slack: float = 0.0
    _spent: deque[tuple[float, int]] = field(default_factory=deque, init=False, repr=False)
    _in_call: int = field(default=0, init=False, repr=False)
    _held_until: float = field(default=float("-inf"), init=False, repr=False)
    _next_at: float = field(default=float("-inf"), init=False, repr=False)
    _started_at: float | None = field(default=None, init=False, repr=False)
    _latency: float = field(default=0.0, init=False, repr=False)

    @property
    def unlimited(self) -> bool:
        return self.budget <= 0

    @property
    def latency(self) -> float:
        """Recent call latency (start to answer, smoothed), 0 before the first answer."""
        return self._latency

    def ceiling(self) -> int:
        """What the window may hold: the budget, plus what the recent call latency costs the
        lane, at most `slack` of the budget."""
        if self.unlimited:
            return 0
        extra = self.budget * min(self.slack, self._latency / self.window_s)
        return self.budget + math.floor(extra + _EPSILON)

    def call_size(self, max_entries: int) -> int:
        """Recipients per call: the budget of a tick or of twice the recent call latency,
        whichever is longer, between 1 and max_entries, evened out so what the window may
        hold (`ceiling`) splits into calls of nearly one size: a slack smaller than a call
        would otherwise never be used."""
        if self.unlimited:
            return max_entries
        span = max(self.tick_s, 2 * self._latency)
        largest = max(1, min(max_entries, math.ceil(self.budget * span - _EPSILON)))
        room = self.ceiling()
        calls = math.ceil(room / largest)  # equal calls, so the last one is not a sliver
        return max(1, math.ceil(room / calls))

    def hold_until(self, until: float) -> None:
        self._held_until = max(self._held_until, until)

    def used(self, now: float) -> int:
        """Recipients counted against the window at `now` (in a call, or answered within it)."""
        self._expire(now)
        return self._counted_at(now)

    def _expire(self, now: float) -> None:
        """Forget the calls whose second after their answer is over by `now`."""
        spent = self._spent
        while spent and spent[0][0] <= now:
            spent.popleft()

    def _counted_at(self, at: float) -> int:
        """What the window will count at `at` (not before now) if nothing else starts."""
        return self._in_call + sum(n for expires, n in self._spent if expires > at)

    def admit(self, wanted: int, now: float, ahead: float = 0.0) -> tuple[int, float]:
        """How many of `wanted` recipients may go into a call starting `ahead` seconds after
        `now`, and, when none may, how long to wait before asking again. Does not book
        anything: call `started` with the count actually sent, then `finished` when its
        answer (or error) is back.

        With `ahead` > 0 the answer is a forecast (the window as it will be then, if nothing
        else starts), so the caller can do its work before the request meanwhile; right
        before the request, `until_free` says whether the room is really there."""
        if wanted <= 0:
            return 0, 0.0
        if self.unlimited:
            return wanted, 0.0
        least = max(1, min(wanted, self.budget, (wanted + 1) // 2))
        return self._room(wanted, least, now, ahead)

    def admit_costs(
        self, costs: Sequence[int], now: float, ahead: float = 0.0
    ) -> tuple[int, float]:
        """`admit` for rows of unequal cost (an SMS campaign limited in segments, a row
        costing its message's segments): how many of the rows, in order, may go into a call
        starting at `now` (the prefix whose summed cost fits the room), and, when none may,
        how long to wait. `started` and `finished` then take the admitted rows' summed cost.

        As with `admit`, a call waits for room for half its cost (at most the budget) and
        at least its first row. A row costing more than the whole budget can never fit: it
        goes alone once the window is empty, and nothing else goes until a window after its
        answer, so the lane's bound in any second is max(budget, the dearest row) rather
        than a lane stuck for good. Rows costing 0 (skipped without a request) always go."""
        if not costs:
            return 0, 0.0
        wanted = sum(costs)
        if wanted <= 0 or self.unlimited:
            return len(costs), 0.0
        first = costs[0]
        if first > self.budget:
            least = self.budget  # the whole budget free: an empty window
        else:
            least = max(first, min(wanted, self.budget, (wanted + 1) // 2))
        units, wait = self._room(wanted, least, now, ahead)
        if not units:
            return 0, wait
        return max(1, affordable_rows(costs, units)), 0.0

    def call_rows(self, costs: Sequence[int], max_entries: int) -> int:
        """Rows in the next call when rows cost unequal units: as many of the queue's head
        (`costs`, in order) as fit the cost `call_size` gives a call of `max_entries` rows,
        rows not queued yet priced like the dearest queued one (so a lane lingers for a
        fuller call as it does with equal costs); at least one row."""
        head = list(costs[:max_entries])
        if not head:
            return max_entries
        priced = head + [max(head)] * (max_entries - len(head))
        return max(1, affordable_rows(priced, self.call_size(sum(priced))))

    def until_free(self, units: int, now: float) -> float:
        """0 when a call of `units` may start at `now`, else how long until it may: the check
        right before the request of a call admitted ahead of time. A call dearer than the
        budget waits for an empty window (as `admit_costs` admits it)."""
        if self.unlimited or units <= 0:
            return 0.0
        if now < self._held_until:
            return self._held_until - now
        return self._wait_for(min(units, self.ceiling()), now)

    def _room(self, wanted: int, least: int, now: float, ahead: float = 0.0) -> tuple[int, float]:
        """Units of `wanted` admitted at `now` + `ahead` when the window then has room for
        `least` of them, else (0, how long until it may)."""
        at = now + max(0.0, ahead)
        if at < self._held_until:
            return 0, self._held_until - at
        if at < self._next_at - _EPSILON:
            return 0, self._next_at - at
        self._expire(now)  # what expires by `at` is kept: `at` may be ahead of now
        room = self.ceiling() - self._counted_at(at)
        if room >= least:
            return min(wanted, room), 0.0
        return 0, self._wait_for(least, at)

    def _wait_for(self, units: int, at: float) -> float:
        """How long after `at` the window has room for `units` (none starting meanwhile)."""
        if self._in_call:  # another call of this lane is out: its answer frees nothing yet
            return self.window_s
        free = self.ceiling() - self._counted_at(at)
        if free >= units:
            return 0.0
        for expires, n in self._spent:
            if expires > at:
                free += n
                if free >= units:
                    return max(0.0, expires - at) + _EPSILON
        return self.window_s

    def started(self, n: int, now: float | None = None) -> None:
        """`n` recipients went into a call; with `now`, the next call waits its turn (n / budget
        later), which only spreads calls: the window alone keeps the bound.

        Turns are kept on a grid, and a late call does not move it: after a call that started
        past the next turn (a busy event loop, or the window full because an earlier call's
        answer was slow), the next call may follow as soon as the window has room. Moving the
        grid to every late start would make one slow answer push back every later call of
        the lane, not only the one whose room it held; those delays add up to a few percent
        of the rate. After an idle gap (not at the first call) one call may follow at once, then
        the turns resume."""
        self._in_call += n
        self._started_at = now
        if now is not None and self.budget > 0:
            turn = n / self.budget
            if self._next_at == float("-inf"):  # the first call: its turn is now
                self._next_at = now
            self._next_at = max(self._next_at + turn, now)

    def finished(self, n: int, now: float) -> None:
        self._in_call = max(0, self._in_call - n)
        if self._started_at is not None:
            took = max(0.0, now - self._started_at)
            self._latency += _LATENCY_WEIGHT * (took - self._latency)
            self._started_at = None
        expires = now + self.window_s
        if self._spent and self._spent[-1][0] > expires:  # keep expiries in order
            expires = self._spent[-1][0]
        self._spent.append((expires, n))

    def set_budget(self, budget: int) -> None:
        """A new budget applies at once; what the window already holds stays counted, so a
        lower budget waits until the window has drained below it (no burst)."""
        self.budget = budget
