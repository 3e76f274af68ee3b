"""The channel seam: what a lane needs from the provider of its campaign's channel.

The claim, the offset fence, the lanes, the pacing and the pause checks (streams.sender) are
the same for every channel. What differs is behind `Channel.send`: how the rows of one lane
call become provider requests (one SendBulkEmail for up to 50 emails; one SendTextMessage per
SMS), how each answer maps to a recipient status (streams.rules.outcomes,
streams.rules.sms_outcomes), and which address check applies (streams.rules.addresses,
streams.rules.phones). Email's implementation is the sender's own `call_ses`; SMS's is
streams.sms_channel.SmsChannel, push's streams.push_channel.PushChannel.
"""

from __future__ import annotations

from typing import Protocol

from sinks.recipient_store import ClaimedRecipient, LiveCampaign
from streams.call_outcome import CallOutcome


class Channel(Protocol):
    # Rows per lane call (at most the sender's MAX_ENTRIES). The rows of a call enter it
    # together (in_call_at), so a worker killed mid-call leaves them all unknown: a channel
    # that sends a call's rows one request each keeps this near what it has in flight.
    max_entries: int

    async def send(
        self, campaign: LiveCampaign, rows: list[ClaimedRecipient], not_before: float
    ) -> CallOutcome:
        """Send the rows of one lane call (one campaign, rows already entered their call):
        every row ends in `final` or `retry`. No request leaves before `not_before`
        (time.monotonic(): the lane's window has room from then on). Never raises for a
        provider's answer."""
        ...

    def segments(self, campaign: LiveCampaign, row: ClaimedRecipient) -> int:
        """What `row` costs against a campaign limited in segments (campaigns.rate_unit): its
        message's segments as `send` would send it, 0 for a row `send` skips without a
        request. Only SMS campaigns take that unit."""
        ...

    def close(self) -> None:
        """Release threads and connections (the worker is stopping)."""
        ...
