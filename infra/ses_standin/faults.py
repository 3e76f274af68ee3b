"""Run-time behaviour knobs: injected faults and account limits.

`FaultConfig` is frozen; the admin API replaces it with `updated(changes)`. `FaultDice` draws
the random outcomes from one seedable generator so a run can be reproduced with `--seed`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Faults and limits of the simulated account (see the admin API `/_admin/faults`)."""

    latency_ms: float = 0.0  # added to every SES call
    jitter_ms: float = 0.0  # plus uniform [0, jitter_ms)
    p429: float = 0.0  # per send call: answer 429 TooManyRequestsException, accept nothing
    p_transient: float = 0.0  # per bulk entry: TRANSIENT_FAILURE, entry not accepted
    p_hang: float = 0.0  # per send call: accept and record, then never answer
    max_send_rate: float = 0.0  # recipients/s (token bucket of 1 s); <= 0 is unlimited
    max_24h_send: float = -1.0  # recipients per rolling 24 h; <= 0 is unlimited
    sending_enabled: bool = True  # False: account sending paused
    hang_max_s: float = 600.0  # a hung call is answered (500) after this, if still connected
    # A regex: a send call with a destination it finds (re.search) is refused whole, 400
    # BadRequestException naming the address, as SES refuses an address it cannot use. Lets a
    # test put an address past the client's own check; "" refuses nothing.
    refuse_addresses: str = ""
    # SMS (pinpoint-sms-voice-v2): messages/s per origination identity (a bucket of one
    # second; beyond it a ThrottlingException, nothing sent), and the month's spend limit in
    # USD (beyond it ServiceQuotaExceededException MONTHLY_SPEND_LIMIT_REACHED_FOR_TEXT).
    # <= 0: unlimited. latency, p429 (as ThrottlingException), p_hang and sending_enabled
    # apply to SMS calls too.
    sms_mps: float = 0.0
    sms_monthly_spend_usd: float = 0.0
    # Mobile push (SNS Publish to platform endpoints): publishes/s of the account (a bucket
    # of one second; beyond it Publish answers Throttling). <= 0: unlimited.
    mobile_push_mps: float = 0.0

    def updated(self, changes: Mapping[str, Any]) -> FaultConfig:
        """A copy with `changes` applied; ValueError names the first bad key or value."""
        known = {f.name: f for f in fields(self)}
        values: dict[str, Any] = {}
        for key, raw in changes.items():
            if key not in known:
                raise ValueError(f"unknown setting {key!r}; known: {sorted(known)}")
            if key == "sending_enabled":
                if not isinstance(raw, bool):
                    raise ValueError("sending_enabled must be a boolean")
                values[key] = raw
                continue
            if key == "refuse_addresses":
                if not isinstance(raw, str):
                    raise ValueError("refuse_addresses must be a string (a regular expression)")
                try:
                    re.compile(raw)
                except re.error as exc:
                    raise ValueError(f"refuse_addresses is not a regex: {exc}") from None
                values[key] = raw
                continue
            if isinstance(raw, bool) or not isinstance(raw, int | float):
                raise ValueError(f"{key} must be a number")
            value = float(raw)
            if key.startswith("p") and not 0.0 <= value <= 1.0:
                raise ValueError(f"{key} must be a probability in [0, 1]")
            if key in ("latency_ms", "jitter_ms", "hang_max_s") and value < 0:
                raise ValueError(f"{key} must be >= 0")
            values[key] = value
        return replace(self, **values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class FaultDice:
    """Random draws for the configured probabilities."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self.random = self._rng.random  # bound method: cheapest per-entry draw

    def latency_s(self, config: FaultConfig) -> float:
        if config.latency_ms <= 0 and config.jitter_ms <= 0:
            return 0.0
        jitter = self._rng.uniform(0.0, config.jitter_ms) if config.jitter_ms > 0 else 0.0
        return (config.latency_ms + jitter) / 1000.0

    def hit(self, probability: float) -> bool:
        return probability > 0.0 and (probability >= 1.0 or self._rng.random() < probability)
