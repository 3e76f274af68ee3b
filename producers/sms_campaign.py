"""What starting an SMS campaign adds: the provider's opt-out list into the suppression table.

A recipient who replies STOP to any of our messages is put on the origination identity's
opt-out list by AWS End User Messaging SMS (its default keyword handling). Copying that list
into the suppression table, keyed by the normalised number, right before the snapshot keeps
every opted-out number out of the next campaign; the sender's re-check before each call
(enter_call) catches numbers suppressed while a campaign runs.
"""

from __future__ import annotations

import psycopg

from flashsend.settings import Settings
from sinks.queries import query
from sinks.sms import SmsSender, make_sms_client
from streams.rules.phones import normalise_phone, phone_problem


def sync_opt_outs(settings: Settings, conn: psycopg.Connection) -> int:
    """Suppress every number of the opt-out list; returns how many were new. Raises
    sinks.sms.SmsCallFailed when the list cannot be read (the campaign must not start)."""
    sms = SmsSender(make_sms_client(settings, pool=2))
    numbers = {normalise_phone(n) for n in sms.opted_out_numbers(settings.sms_opt_out_list)}
    valid = sorted(n for n in numbers if phone_problem(n) is None)
    if not valid:
        return 0
    return conn.execute(query("suppress_opted_out_numbers"), {"numbers": valid}).rowcount
