"""`pinpoint-sms-voice-v2` over HTTP: the JSON 1.0 protocol (POST /, `X-Amz-Target:
PinpointSMSVoiceV2.<Operation>`, `application/x-amz-json-1.0` bodies; errors are 4xx/5xx with
`{"__type": shape, "Message": …, "Reason": …}`), and its admin routes.

| route                                   | answer                                             |
|-----------------------------------------|----------------------------------------------------|
| GET  /_admin/sms/stats[?campaign=C]     | accepted, duplicates, max_1s_window (messages),    |
|                                         | max_1s_window_segments, segments, …                |
| GET  /_admin/sms/messages[?destination=A&campaign=C] | accepted messages                     |
| POST /_admin/sms/inbound {"from", "to", "body"} | a reply; STOP opts the number out; with    |
|                                         | two-way on for `to` (UpdatePhoneNumber), published |
|                                         | to its SNS topic                                   |
| POST /_admin/sms/reset                  | forget messages, opt-outs, buckets, two-way        |

Operations: SendTextMessage, PutOptedOutNumber, DescribeOptedOutNumbers, UpdatePhoneNumber
(its two-way settings). Accepted messages with a ConfigurationSetName publish TEXT_* events
to the SNS subscriptions of that configuration set (emission.py), as SES messages do.

Faults (latency, p429, p_hang, sending_enabled, sms_mps, sms_monthly_spend_usd) are the
account's (`/_admin/faults`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from infra.ses_standin.account import SesAccount
from infra.ses_standin.sms import SmsAccount, SmsError

TARGET_PREFIX = "PinpointSMSVoiceV2."
CONTENT_TYPE = "application/x-amz-json-1.0"

HoldOpen = Callable[[web.Request, SesAccount], Awaitable[web.StreamResponse]]


def _answer(body: Any, status: int = 200, error_type: str | None = None) -> web.Response:
    headers = {"x-amzn-RequestId": str(uuid.uuid4())}
    if error_type:
        headers["x-amzn-ErrorType"] = error_type
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return web.Response(body=raw, status=status, headers=headers, content_type=CONTENT_TYPE)


class SmsApi:
    def __init__(self, account: SesAccount, sms: SmsAccount, hold_open: HoldOpen) -> None:
        self.account = account
        self.sms = sms
        self.hold_open = hold_open

    def register(self, app: web.Application) -> None:
        router = app.router  # POST / (shared with Firehose) is routed by `server.py`
        router.add_get("/_admin/sms/stats", self.stats)
        router.add_get("/_admin/sms/messages", self.messages)
        router.add_post("/_admin/sms/inbound", self.inbound)
        router.add_post("/_admin/sms/reset", self.reset)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        target = request.headers.get("X-Amz-Target", "")
        operation = target.removeprefix(TARGET_PREFIX)
        delay = self.account.latency_s()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            raw = await request.read()
            body = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise SmsError("ValidationException", 400, "Body must be a JSON object.")
            now = time.time()
            if operation == "SendTextMessage":
                message_id = self.sms.send_text(body, now)
                if self.account.hang_now():
                    self.account.note_hang(1)
                    return await self.hold_open(request, self.account)
                return _answer({"MessageId": message_id})
            if operation == "PutOptedOutNumber":
                name = str(body.get("OptOutListName") or "")
                number = str(body.get("OptedOutNumber") or "")
                return _answer(self.sms.put_opted_out(name, number, now))
            if operation == "DescribeOptedOutNumbers":
                return _answer(self.sms.describe_opted_out(body))
            if operation == "UpdatePhoneNumber":
                return _answer(self.sms.update_phone_number(body))
            raise SmsError(
                "ValidationException", 400, f"Unknown operation {target!r}.", "UNKNOWN_OPERATION"
            )
        except ValueError:
            error = SmsError("ValidationException", 400, "Body is not JSON.", "CANNOT_PARSE")
            return _answer(error.body(), error.status, error.code)
        except SmsError as exc:
            return _answer(exc.body(), exc.status, exc.code)

    async def stats(self, request: web.Request) -> web.Response:
        stats = self.sms.stats(request.query.get("campaign"))
        # Process-wide, as in /_admin/stats: calls accepted and never answered.
        stats["hung_calls"] = self.account.hung_calls
        stats["hung_recipients"] = self.account.hung_recipients
        return web.json_response({**stats, "now": time.time()})

    async def messages(self, request: web.Request) -> web.Response:
        q = request.query
        return web.json_response(self.sms.messages(q.get("destination"), q.get("campaign")))

    async def inbound(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
            origin, text = str(body["from"]), str(body.get("body", ""))
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'body: {"from": number, "body": text}'}, status=400)
        to = str(body.get("to") or "")
        return web.json_response(self.sms.inbound(origin, to, text, time.time()))

    async def reset(self, request: web.Request) -> web.Response:
        self.sms.reset()
        return web.json_response({"ok": True})
