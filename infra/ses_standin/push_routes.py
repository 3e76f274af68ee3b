"""Amazon SNS's mobile push operations over HTTP: the query protocol (POST / with a
form-encoded body, `Action=<Operation>&Version=2010-03-31`; XML answers; errors are
`<ErrorResponse><Error><Type>Sender</Type><Code>…</Code>`), and its admin routes.

| route                                        | answer                                      |
|----------------------------------------------|---------------------------------------------|
| GET  /_admin/push/stats[?campaign=C]         | accepted, duplicates (publishes to an       |
|                                              | endpoint beyond its first), max_1s_window … |
| GET  /_admin/push/messages[?endpoint=A&campaign=C] | accepted publishes                    |
| POST /_admin/push/invalidate {"token"}       | the platform reports the token invalid      |
| POST /_admin/push/endpoints {"application", "tokens": [..]} | registers many tokens at   |
|                                              | once (the lab's seeding), their ARNs in order |
| POST /_admin/push/reset                      | forget publishes, buckets, invalid tokens   |

Operations: CreatePlatformApplication, CreatePlatformEndpoint, GetEndpointAttributes,
SetEndpointAttributes, DeleteEndpoint, Publish (to an endpoint ARN). Faults (latency, p429 as
Throttling, p_hang, mobile_push_mps) are the account's (`/_admin/faults`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from aiohttp import web

from infra.ses_standin.account import SesAccount
from infra.ses_standin.push import PushAccount, PushError

NS = "http://sns.amazonaws.com/doc/2010-03-31/"
FORM = "application/x-www-form-urlencoded"

HoldOpen = Callable[[web.Request, SesAccount], Awaitable[web.StreamResponse]]


def is_query_request(request: web.Request) -> bool:
    """SNS's query protocol (no X-Amz-Target, a form body) rather than a JSON protocol."""
    return not request.headers.get("X-Amz-Target") and request.content_type == FORM


def _xml(action: str, result: str) -> web.Response:
    body = (
        f'<{action}Response xmlns="{NS}"><{action}Result>{result}</{action}Result>'
        f"<ResponseMetadata><RequestId>standin</RequestId></ResponseMetadata></{action}Response>"
    )
    return web.Response(text=body, content_type="text/xml")


def _error(exc: PushError) -> web.Response:
    body = (
        f'<ErrorResponse xmlns="{NS}"><Error><Type>Sender</Type><Code>{exc.code}</Code>'
        f"<Message>{escape(exc.message)}</Message></Error>"
        "<RequestId>standin</RequestId></ErrorResponse>"
    )
    return web.Response(text=body, status=exc.status, content_type="text/xml")


def entries(form: Mapping[str, str], prefix: str) -> dict[str, str]:
    """A map member as the query protocol flattens it: `<prefix>.entry.N.key/value`."""
    out: dict[str, str] = {}
    n = 1
    while f"{prefix}.entry.{n}.key" in form:
        out[form[f"{prefix}.entry.{n}.key"]] = form.get(f"{prefix}.entry.{n}.value", "")
        n += 1
    return out


def _attributes_xml(attributes: Mapping[str, str]) -> str:
    items = "".join(
        f"<entry><key>{escape(k)}</key><value>{escape(v)}</value></entry>"
        for k, v in sorted(attributes.items())
    )
    return f"<Attributes>{items}</Attributes>"


class PushApi:
    def __init__(self, account: SesAccount, push: PushAccount, hold_open: HoldOpen) -> None:
        self.account = account
        self.push = push
        self.hold_open = hold_open

    def register(self, app: web.Application) -> None:
        router = app.router  # POST / is routed by `server.py`
        router.add_get("/_admin/push/stats", self.stats)
        router.add_get("/_admin/push/messages", self.messages)
        router.add_post("/_admin/push/invalidate", self.invalidate)
        router.add_post("/_admin/push/endpoints", self.register_many)
        router.add_post("/_admin/push/reset", self.reset)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        form = dict(parse_qsl((await request.read()).decode(), keep_blank_values=True))
        action = form.get("Action", "")
        delay = self.account.latency_s()
        if delay > 0:
            await asyncio.sleep(delay)
        push = self.push
        try:
            if action == "Publish":
                message_id = push.publish(
                    form.get("TargetArn", ""),
                    form.get("Message", ""),
                    form.get("MessageStructure"),
                    time.time(),
                )
                if self.account.hang_now():
                    self.account.note_hang(1)
                    return await self.hold_open(request, self.account)
                return _xml(action, f"<MessageId>{message_id}</MessageId>")
            if action == "CreatePlatformApplication":
                arn = push.create_application(
                    form.get("Name", ""), form.get("Platform", ""), entries(form, "Attributes")
                )
                return _xml(action, f"<PlatformApplicationArn>{arn}</PlatformApplicationArn>")
            if action == "CreatePlatformEndpoint":
                arn = push.create_endpoint(
                    form.get("PlatformApplicationArn", ""),
                    form.get("Token", ""),
                    form.get("CustomUserData"),
                    entries(form, "Attributes"),
                )
                return _xml(action, f"<EndpointArn>{arn}</EndpointArn>")
            if action == "GetEndpointAttributes":
                attributes = push.get_attributes(form.get("EndpointArn", ""))
                return _xml(action, _attributes_xml(attributes))
            if action == "SetEndpointAttributes":
                push.set_attributes(form.get("EndpointArn", ""), entries(form, "Attributes"))
                return _xml(action, "")
            if action == "DeleteEndpoint":
                push.delete_endpoint(form.get("EndpointArn", ""))
                return _xml(action, "")
            raise PushError("InvalidAction", 400, f"Unknown action {action!r}.")
        except PushError as exc:
            return _error(exc)

    async def stats(self, request: web.Request) -> web.Response:
        stats = self.push.stats(request.query.get("campaign"))
        return web.json_response({**stats, "now": time.time()})

    async def messages(self, request: web.Request) -> web.Response:
        q = request.query
        return web.json_response(self.push.messages(q.get("endpoint"), q.get("campaign")))

    async def invalidate(self, request: web.Request) -> web.Response:
        try:
            token = str(json.loads(await request.read() or b"{}")["token"])
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'body: {"token": device token}'}, status=400)
        return web.json_response({"token": token, "endpoints": self.push.invalidate(token)})

    async def register_many(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
            application, tokens = str(body["application"]), [str(t) for t in body["tokens"]]
            arns = [self.push.register_enabled(application, t) for t in tokens]
        except (ValueError, KeyError, TypeError):
            return web.json_response(
                {"error": 'body: {"application": ARN, "tokens": [...]}'}, status=400
            )
        except PushError as exc:
            return web.json_response({"error": exc.message, "code": exc.code}, status=exc.status)
        return web.json_response({"endpoint_arns": arns})

    async def reset(self, request: web.Request) -> web.Response:
        self.push.reset()
        return web.json_response({"ok": True})
