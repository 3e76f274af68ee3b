"""RFC 8058 one-click unsubscribe: `GET /u/{token}` shows a page, `POST /u/{token}` opts out.

The traps this answers (seed, traps 7 and 8):
- Mail scanners and link previewers follow every link in a message, so GET must change
  nothing: it shows a small page whose button POSTs back (trap 7).
- Gmail's and Yahoo's one-click POST carries no cookie, no session and no CSRF token, with the
  body `List-Unsubscribe=One-Click`: nothing here asks for any of them, and the answer is a plain
  200 page, never a redirect (trap 8: a CSRF middleware answering 419 silently breaks it).
- The token is the only credential: HMAC-signed (user, campaign), non-expiring, key-rotatable
  (`streams.rules.unsubscribe_token`). Anything it does not verify gets 403 and changes nothing.
- PostgreSQL is the source of truth: the opt-out commits before the answer, whether Kafka is
  up or not; the `Unsubscribed` event waits in the outbox. A repeated POST is a no-op.
- No cookie is ever set, and the pages are not cacheable and send no referrer.
"""

from __future__ import annotations

import html
import logging
from collections import Counter
from urllib.parse import parse_qs, unquote

from producers.http_lean import Request, Response, Router
from sinks.feedback_store import UnsubscribeStore
from sinks.recipient_store import StoreUnavailable
from streams.rules.unsubscribe_token import TokenKeys, read_token

log = logging.getLogger("flashsend.webhook.unsubscribe")

MAX_FORM_BYTES = 4096
PATH_PREFIX = "/u/"  # + token: the List-Unsubscribe target (deploy/kubernetes routes it)
_CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'"
_HEADERS = (
    ("Cache-Control", "no-store"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Robots-Tag", "noindex"),
    ("Content-Security-Policy", _CSP),
)
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{title}</title>
<style>body{{font-family:sans-serif;max-width:32em;margin:4em auto;padding:0 1em}}
button{{font-size:1.1em;padding:.5em 1.2em}}</style></head>
<body><h1>{title}</h1>{body}</body></html>
"""
_CONFIRM = """<p>Do you want to stop receiving marketing email from us?
Order confirmations and other messages about your account will still arrive.</p>
<form method="post" action="{action}">
<input type="hidden" name="List-Unsubscribe" value="One-Click">
<button type="submit">Unsubscribe</button></form>"""
_DONE = "<p>You will not receive marketing email from us any more.</p>"
_INVALID = "<p>This unsubscribe link is not valid. It may have been copied incompletely.</p>"


def _page(title: str, body: str, status: int = 200) -> Response:
    page = _PAGE.format(title=html.escape(title), body=body)
    return Response(status, page.encode(), "text/html; charset=utf-8", _HEADERS)


def _is_one_click(content_type: str, raw: bytes) -> bool:
    """RFC 8058 §3.1: the POST body contains `List-Unsubscribe=One-Click`."""
    if content_type.startswith("multipart/"):
        return b"One-Click" in raw and b'name="List-Unsubscribe"' in raw
    values = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
    return values.get("List-Unsubscribe") == ["One-Click"]


class UnsubscribeEndpoint:
    def __init__(self, keys: TokenKeys, store: UnsubscribeStore) -> None:
        self.keys = keys
        self.store = store
        self.stats: Counter[str] = Counter()

    def register(self, router: Router) -> None:
        router.add_prefix("GET", PATH_PREFIX, self.confirm_page)
        router.add_prefix("POST", PATH_PREFIX, self.one_click)

    async def confirm_page(self, request: Request) -> Response:
        """Shows a button; changes nothing (scanners GET every link)."""
        token = unquote(request.params["tail"])
        if read_token(self.keys, token) is None:
            self.stats["get_invalid"] += 1
            return _page("Invalid link", _INVALID, status=403)
        self.stats["get"] += 1
        action = html.escape(f"/u/{token}", quote=True)
        return _page("Unsubscribe", _CONFIRM.format(action=action))

    async def one_click(self, request: Request) -> Response:
        claim = read_token(self.keys, unquote(request.params["tail"]))
        if claim is None:
            self.stats["post_invalid"] += 1
            log.warning("unsubscribe refused: invalid token from %s", request.remote)
            return _page("Invalid link", _INVALID, status=403)
        raw = request.body
        if len(raw) > MAX_FORM_BYTES:
            return _page("Bad request", "<p>Request too large.</p>", status=413)
        content_type = request.header("content-type").split(";", 1)[0].strip().lower()
        if not _is_one_click(content_type, raw):
            self.stats["post_bad_body"] += 1
            body = "<p>Expected the form field List-Unsubscribe=One-Click.</p>"
            return _page("Bad request", body, status=400)
        try:
            result = await self.store.unsubscribe(claim.user_id, claim.campaign_id, claim.kid)
        except StoreUnavailable as exc:
            self.stats["post_unavailable"] += 1
            log.error(
                "unsubscribe of user %s not recorded (database unavailable): %s", claim.user_id, exc
            )
            return _page("Try again", "<p>Please try again in a minute.</p>", status=503)
        self.stats["post_changed" if result.changed else "post_repeat"] += 1
        log.info(
            "unsubscribed user=%s campaign=%s kid=%s changed=%s event_id=%s",
            claim.user_id,
            claim.campaign_id,
            claim.kid,
            result.changed,
            result.event_id,
        )
        return _page("Unsubscribed", _DONE)
