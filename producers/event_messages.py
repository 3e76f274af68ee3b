"""One notification `Message` → its `ses_event` records, whichever provider wrote it (pure).

Every ingest path (the SNS webhook, the SQS puller, the dead-letter replay) calls
`parse_event_message`, so they agree on what is readable: an SES event (producers.ses_events)
or an AWS End User Messaging SMS event or reply (producers.sms_events), or an SNS mobile push
application event (producers.push_events). The JSON is decoded
once; anything else is `SesEventInvalid` with the SES parser's reason.
"""

from __future__ import annotations

from typing import Any

from producers.push_events import is_push_data, parse_push_data
from producers.ses_events import decode_message, parse_ses_data
from producers.sms_events import is_sms_data, parse_sms_data


def parse_event_message(
    message: str, *, sns_message_id: str, received_at_ms: int
) -> list[dict[str, Any]]:
    """Records ready for `AvroCodec("ses_event").encode`, in order; SesEventInvalid if none."""
    data = decode_message(message)
    parse = (
        parse_sms_data
        if is_sms_data(data)
        else parse_push_data
        if is_push_data(data)
        else parse_ses_data
    )
    return parse(data, sns_message_id=sns_message_id, received_at_ms=received_at_ms)
