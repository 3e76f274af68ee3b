"""What happens to an accepted message after SES took it: delivered, bounced, complained… (pure).

Mailbox-simulator addresses behave as the SES developer guide documents them (labels such as
`bounce+x@` allowed):

| address                                  | events                                           |
|------------------------------------------|--------------------------------------------------|
| success@simulator.amazonses.com          | Delivery                                         |
| bounce@…                                 | Bounce Permanent/General (550 5.1.1)             |
| ooto@…                                   | Delivery, then Bounce Transient/General (the     |
|                                          | auto-reply, as the simulator reports it)         |
| complaint@…                              | Delivery, then Complaint (abuse)                 |
| suppressionlist@…                        | Bounce Permanent/OnAccountSuppressionList        |

Every other address gets an outcome drawn from `FeedbackRates` by hashing the address with a
salt, not by a random draw per message: a mailbox that does not exist bounces every time it is
mailed, and a load test can tell exactly which addresses were made to bounce or complain.
`p_reject` is per message (content: SES found a virus), drawn from the message id.

Engagement (Open, Click events) is drawn the same way, per (template, address), from the
`Engagement` set for the message's template (else the one for `*`): a template that makes
people click makes the same people click every time, so a test can make one variant of an
A/B test win. A click implies an open; only a delivered mail is opened.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

SIMULATOR_DOMAIN = "simulator.amazonses.com"

DELIVERED = "delivered"
BOUNCE = "bounce"  # permanent
COMPLAINT = "complaint"  # delivered, then complained
SOFT_BOUNCE = "soft_bounce"  # transient (mailbox full)
DELAY = "delay"  # DeliveryDelay, then delivered
OOTO = "ooto"  # delivered, then an auto-reply reported as a transient bounce
SUPPRESSED = "suppressed"  # permanent bounce: on the account's suppression list
OUTCOMES = (DELIVERED, BOUNCE, COMPLAINT, SOFT_BOUNCE, DELAY, OOTO, SUPPRESSED)

_SIMULATOR = {
    "success": DELIVERED,
    "bounce": BOUNCE,
    "ooto": OOTO,
    "complaint": COMPLAINT,
    "suppressionlist": SUPPRESSED,
}
_SCALE = float(2**64)


@dataclass(frozen=True, slots=True)
class FeedbackRates:
    """Shares of addresses (not simulator ones) per outcome; the rest is delivered."""

    p_bounce: float = 0.0
    p_complaint: float = 0.0
    p_soft_bounce: float = 0.0
    p_delay: float = 0.0
    p_reject: float = 0.0  # per message
    salt: str = ""  # another salt picks other addresses

    def updated(self, changes: Mapping[str, Any]) -> FeedbackRates:
        """A copy with `changes` applied; ValueError names the first bad key or value."""
        known = {f.name for f in fields(self)}
        values: dict[str, Any] = {}
        for key, raw in changes.items():
            if key not in known:
                raise ValueError(f"unknown feedback setting {key!r}; known: {sorted(known)}")
            if key == "salt":
                if not isinstance(raw, str) or len(raw) > 100:
                    raise ValueError("salt must be a string of at most 100 characters")
                values[key] = raw
                continue
            if isinstance(raw, bool) or not isinstance(raw, int | float):
                raise ValueError(f"{key} must be a number")
            if not 0.0 <= float(raw) <= 1.0:
                raise ValueError(f"{key} must be a probability in [0, 1]")
            values[key] = float(raw)
        new = replace(self, **values)
        if new.p_bounce + new.p_complaint + new.p_soft_bounce + new.p_delay > 1.0:
            raise ValueError("p_bounce + p_complaint + p_soft_bounce + p_delay must be <= 1")
        return new

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _unit(text: str) -> float:
    """A uniform number in [0, 1) fixed by `text`."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


def simulator_outcome(address_key: str) -> str | None:
    """The simulator's scripted outcome for a lower-cased bare address, or None."""
    local, at, domain = address_key.rpartition("@")
    if not at or domain != SIMULATOR_DOMAIN:
        return None
    return _SIMULATOR.get(local.split("+", 1)[0], DELIVERED)


def recipient_outcome(address_key: str, rates: FeedbackRates) -> str:
    """Outcome for one recipient (a lower-cased bare address)."""
    scripted = simulator_outcome(address_key)
    if scripted is not None:
        return scripted
    if not (rates.p_bounce or rates.p_complaint or rates.p_soft_bounce or rates.p_delay):
        return DELIVERED
    u = _unit(f"{rates.salt}|{address_key}")
    for outcome, p in (
        (BOUNCE, rates.p_bounce),
        (COMPLAINT, rates.p_complaint),
        (SOFT_BOUNCE, rates.p_soft_bounce),
        (DELAY, rates.p_delay),
    ):
        if u < p:
            return outcome
        u -= p
    return DELIVERED


def message_rejected(message_id: str, rates: FeedbackRates) -> bool:
    return rates.p_reject > 0 and _unit(f"{rates.salt}|reject|{message_id}") < rates.p_reject


def event_types_for(outcome: str) -> tuple[str, ...]:
    """SES event types, in order, that one recipient's outcome produces (after Send)."""
    return {
        DELIVERED: ("Delivery",),
        BOUNCE: ("Bounce",),
        COMPLAINT: ("Delivery", "Complaint"),
        SOFT_BOUNCE: ("Bounce",),
        DELAY: ("DeliveryDelay", "Delivery"),
        OOTO: ("Delivery", "Bounce"),
        SUPPRESSED: ("Bounce",),
    }[outcome]


OPENED = "open"
CLICKED = "click"
# Outcomes whose mail reaches the mailbox (and so can be opened).
_DELIVERED_OUTCOMES = frozenset({DELIVERED, COMPLAINT, DELAY, OOTO})


@dataclass(frozen=True, slots=True)
class Engagement:
    """Shares of delivered recipients of one template who open / click the mail."""

    p_open: float = 0.0
    p_click: float = 0.0

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> Engagement:
        """From `{"p_open": x, "p_click": y}`; ValueError names the first bad key or value."""
        values: dict[str, float] = {}
        for key, raw in body.items():
            if key not in ("p_open", "p_click"):
                raise ValueError(f"unknown engagement setting {key!r}; known: p_open, p_click")
            if isinstance(raw, bool) or not isinstance(raw, int | float):
                raise ValueError(f"{key} must be a number")
            if not 0.0 <= float(raw) <= 1.0:
                raise ValueError(f"{key} must be a probability in [0, 1]")
            values[key] = float(raw)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def engagement_of(
    address_key: str, outcome: str, template: str, engagement: Engagement, salt: str = ""
) -> str | None:
    """CLICKED, OPENED or None for one recipient of a message of `template`."""
    if outcome not in _DELIVERED_OUTCOMES or not (engagement.p_open or engagement.p_click):
        return None
    u = _unit(f"{salt}|engage|{template}|{address_key}")
    if u < engagement.p_click:
        return CLICKED
    if u < max(engagement.p_open, engagement.p_click):
        return OPENED
    return None


def engagement_types(engaged: str) -> tuple[str, ...]:
    """SES event types of one recipient's engagement, in order."""
    return ("Open", "Click") if engaged == CLICKED else ("Open",)
