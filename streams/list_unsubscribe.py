"""RFC 8058 headers for every marketing message: the campaign sender's `headers_for`.

Each bulk entry gets `List-Unsubscribe: <https://…/u/TOKEN>` and `List-Unsubscribe-Post:
List-Unsubscribe=One-Click` as SES ReplacementHeaders, TOKEN signing (user, campaign) with the
current key (streams.unsubscribe_token). Gmail and Yahoo require both headers from bulk senders
and expect the opt-out honoured within two days; ours takes effect at the next batch.
The URL prefix is validated once, when the sender starts: a bad `webhook_public_url` stops the
worker instead of mailing a million broken links.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from flashsend import deliverability
from flashsend.settings import Settings
from sinks.recipient_store import ClaimedRecipient
from streams.unsubscribe_token import make_token, unsubscribe_url

POST_HEADER = "List-Unsubscribe=One-Click"


def unsubscribe_headers(settings: Settings) -> Callable[[ClaimedRecipient], Mapping[str, str]]:
    keys = deliverability.token_keys(settings)
    base = deliverability.public_url(settings)
    sample = make_token(keys, 0, 0)
    prefix = unsubscribe_url(
        base, sample, allow_http=deliverability.allow_http_links(settings)
    ).removesuffix(sample)

    def headers_for(row: ClaimedRecipient) -> Mapping[str, str]:
        token = make_token(keys, row.user_id, row.campaign_id)
        return {"List-Unsubscribe": f"<{prefix}{token}>", "List-Unsubscribe-Post": POST_HEADER}

    return headers_for
