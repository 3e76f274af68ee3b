"""Recipient-rate limiting: a GCRA limiter per partition and an AIMD controller above it.

Why GCRA and not a counter per second: the seed measured a fixed-window limiter (50/s) letting
100 mails through one sliding 1-second window, because two windows' worth can sit either side of
a boundary. GCRA keeps one number, the *theoretical arrival time* (TAT): the instant at which
everything admitted so far would have been paid for at `rate`. That is exactly a token bucket of
`burst` recipients refilled at `rate` per second, with float (sub-second) resolution, so in any
window of length L at most `burst + rate * L` recipients are admitted.

Why per recipient: SES counts its quota in recipients, not API calls; one SendBulkEmail of 50
entries costs 50.

Why per partition (`split_rate`): whoever owns a Kafka partition owns R/P of the budget, so the
sum stays bounded whatever the number of workers, with no shared counter. The price is that P
limiters may each spend a full call at the same instant: the guaranteed bound across P
partitions is `R + P * burst` per sliding second (see tests/unit/test_throttle.py).

Everything here is pure: time comes in as `now` (monotonic seconds), nothing sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Float sums of 1/rate drift by picoseconds; a delay this small is noise, not a wait.
_EPSILON = 1e-9


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


@dataclass
class Pacer:
    """Strict spacing for one sender lane: after a call of n recipients the next may start no
    sooner than n / rate seconds later, measured from when the call actually STARTED.

    Unlike GCRA there is no catch-up: a call that went out late (event loop busy, a slow DB
    write) does not earn the next one an early start, so two calls of the same lane are never
    closer than the rate allows. `headroom` (< 1) keeps a little slack for the network jitter
    between our clock and the provider's.

    Two more things keep P lanes at R/P within R in every sliding second (GCRA alone only
    guarantees R + P*burst, because P lanes can fire at the same instant):
    - `call_size`: at low per-lane rates calls get smaller (one `tick` worth of recipients), so
      a lane never holds more than a fraction of a second of budget in one call;
    - a new pacer (campaign start, or a partition just taken over after a rebalance) waits a
      random 1–2 intervals before its first call: lanes start out of phase instead of firing
      together, and the previous owner's last call has had its interval (no burst).
    """

    rate: float
    headroom: float = 0.97
    tick: float = 0.2
    phase: float = 0.0  # in [0, 1): fraction of an extra interval before the first call
    _next: float | None = field(default=None, init=False, repr=False)

    @property
    def unlimited(self) -> bool:
        return self.rate <= 0

    def call_size(self, max_entries: int) -> int:
        """Recipients per call: a `tick` worth at this rate, between 1 and max_entries."""
        if self.unlimited:
            return max_entries
        return max(1, min(max_entries, int(self.rate * self.tick)))

    def _interval(self, n: int) -> float:
        return n / (self.rate * self.headroom)

    def delay(self, n: int, now: float) -> float:
        """Seconds to wait before a call of n recipients may start."""
        if self.unlimited:
            return 0.0
        if self._next is None:
            self._next = now + self._interval(n) * (1.0 + self.phase)
        return max(0.0, self._next - now)

    def started(self, n: int, now: float) -> None:
        """Record that a call of n recipients started at `now`."""
        if not self.unlimited:
            self._next = now + self._interval(n)

    def set_rate(self, rate: float) -> None:
        self.rate = rate
