"""What one lane call came to: final results, rows to retry, and what the lane must do next
(slow down, pause the campaign). Every channel answers a lane call with one of these."""

from __future__ import annotations

from dataclasses import dataclass

from sinks.recipient_store import ClaimedRecipient, RowResult


@dataclass
class CallOutcome:
    final: list[RowResult]
    retry: list[ClaimedRecipient]
    retry_reason: str | None = None
    throttled: bool = False
    pause_reason: str | None = None
    # False when SES answered with an error instead of per-entry results, or not at all.
    answered: bool = True
    # time.monotonic() in the calling thread when the last answer arrived, before the hop back
    # to the event loop: SES accepted nothing of these calls later than that. None when a call
    # got no answer (the lane then counts it until its own clock says the call is over).
    answered_at: float | None = None

    def merge(self, part: CallOutcome) -> None:
        """Add the outcome of one more call for other rows of the same lane call."""
        self.final += part.final
        self.retry += part.retry
        self.retry_reason = part.retry_reason or self.retry_reason
        self.throttled = self.throttled or part.throttled
        self.pause_reason = self.pause_reason or part.pause_reason
        self.answered = self.answered and part.answered
