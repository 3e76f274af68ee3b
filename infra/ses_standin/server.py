"""aiohttp application speaking SESv2 REST-JSON (the paths of botocore's `sesv2` model).

Handlers are thin: parse with `protocol`, act on `SesAccount`, answer JSON. Every SES answer
carries `x-amzn-RequestId`; errors carry `x-amzn-ErrorType` and `{"message": …}`. SigV4
signatures are not checked. Injected latency applies to every SES operation; a "hang" is
decided after a send was accepted and recorded: the handler then holds the connection open
without answering until the client gives up (or `hang_max_s`, or shutdown).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from json.encoder import encode_basestring_ascii
from typing import Any

from aiohttp import web

from infra.ses_standin.account import SesAccount
from infra.ses_standin.admin_routes import AdminApi
from infra.ses_standin.errors import BadRequest, SesError
from infra.ses_standin.firehose import CONTENT_TYPE as FIREHOSE_CONTENT_TYPE
from infra.ses_standin.firehose import TARGET_PREFIX as FIREHOSE_TARGET
from infra.ses_standin.firehose import FirehoseError
from infra.ses_standin.protocol import (
    parse_bulk_request,
    parse_email_request,
    parse_page,
    parse_template_request,
)
from infra.ses_standin.push_routes import PushApi, is_query_request
from infra.ses_standin.sms_routes import SmsApi
from infra.ses_standin.templates import parse_template_data

ACCOUNT = web.AppKey("account", SesAccount)
STOPPING = web.AppKey("stopping", asyncio.Event)

MAX_REQUEST_BYTES = 50 * 1024 * 1024  # Raw messages may be up to 40 MB
HANG_POLL_S = 0.05

Operation = Callable[[web.Request, SesAccount], Awaitable[web.StreamResponse]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_dumps = json.JSONEncoder(separators=(",", ":")).encode
_quote: Any = encode_basestring_ascii  # json's C function, as `_dumps` quotes strings
_SUCCESS = '{"Status":"SUCCESS","MessageId":'
_SUCCESS_KEYS = ("Status", "MessageId")


def build_app(account: SesAccount) -> web.Application:
    """The stand-in's application: SES routes plus the `/_admin/` API."""
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[ACCOUNT] = account
    app[STOPPING] = asyncio.Event()
    router = app.router
    router.add_post("/v2/email/outbound-bulk-emails", _ses(send_bulk_email))
    router.add_post("/v2/email/outbound-emails", _ses(send_email))
    router.add_post("/v2/email/templates", _ses(create_email_template))
    router.add_get("/v2/email/templates", _ses(list_email_templates))
    router.add_get("/v2/email/templates/{name}", _ses(get_email_template))
    router.add_put("/v2/email/templates/{name}", _ses(update_email_template))
    router.add_delete("/v2/email/templates/{name}", _ses(delete_email_template))
    router.add_post("/v2/email/templates/{name}/render", _ses(test_render_email_template))
    router.add_get("/v2/email/account", _ses(get_account))
    sets = "/v2/email/configuration-sets"
    router.add_post(sets, _ses(create_configuration_set))
    router.add_get(sets + "/{name}", _ses(get_configuration_set))
    router.add_delete(sets + "/{name}", _ses(delete_configuration_set))
    router.add_post(sets + "/{name}/event-destinations", _ses(create_event_destination))
    router.add_get(sets + "/{name}/event-destinations", _ses(get_event_destinations))
    router.add_put(sets + "/{name}/event-destinations/{dest}", _ses(update_event_destination))
    router.add_delete(sets + "/{name}/event-destinations/{dest}", _ses(delete_event_destination))
    AdminApi(account).register(app)
    sms = SmsApi(account, account.sms, _hold_open)
    sms.register(app)
    push = PushApi(account, account.push, _hold_open)
    push.register(app)
    # POST / is shared: pinpoint-sms-voice-v2 and Firehose (JSON, told apart by target) and
    # SNS's mobile push (the query protocol: a form body, no target).
    router.add_post("/", _by_target(sms.dispatch, push.dispatch))
    app.on_shutdown.append(_on_shutdown)
    return app


def ses_json(body: Any, status: int = 200) -> web.Response:
    return _json_response(_dumps(body), status)


def bulk_results_body(results: list[dict[str, str]]) -> str:
    """`_dumps({"BulkEmailEntryResults": results})`, with each success written by hand.

    A success is `{"Status": "SUCCESS", "MessageId": id}` (50 per call); any other result
    goes through json. A test compares the two.
    """
    items = [
        _SUCCESS + _quote(result["MessageId"]) + "}"
        if tuple(result) == _SUCCESS_KEYS and result["Status"] == "SUCCESS"
        else _dumps(result)
        for result in results
    ]
    return '{"BulkEmailEntryResults":[' + ",".join(items) + "]}"


def _json_response(text: str, status: int = 200) -> web.Response:
    return web.Response(
        body=text.encode(),
        status=status,
        content_type="application/json",
        headers={"x-amzn-RequestId": str(uuid.uuid4())},
    )


def ses_error(exc: SesError) -> web.Response:
    return web.Response(
        body=exc.body(),
        status=exc.status,
        content_type="application/json",
        headers={"x-amzn-RequestId": str(uuid.uuid4()), "x-amzn-ErrorType": exc.code},
    )


async def send_bulk_email(request: web.Request, account: SesAccount) -> web.StreamResponse:
    parsed = parse_bulk_request(await _json_body(request))
    results = account.send_bulk(parsed, time.time())
    response = _json_response(bulk_results_body(results))
    if account.hang_now():
        account.note_hang(sum(1 for r in results if r.get("Status") == "SUCCESS"))
        return await _hold_open(request, account)
    return response


async def send_email(request: web.Request, account: SesAccount) -> web.StreamResponse:
    parsed = parse_email_request(await _json_body(request))
    message_id = account.send_email(parsed, time.time())
    if account.hang_now():
        account.note_hang(1)
        return await _hold_open(request, account)
    return ses_json({"MessageId": message_id})


async def create_email_template(request: web.Request, account: SesAccount) -> web.StreamResponse:
    name, content = parse_template_request(await _json_body(request))
    account.create_template(name, content, time.time())
    return ses_json({})


async def list_email_templates(request: web.Request, account: SesAccount) -> web.StreamResponse:
    size, token = parse_page(request.query)
    return ses_json(account.list_templates(size, token))


async def get_email_template(request: web.Request, account: SesAccount) -> web.StreamResponse:
    return ses_json(account.get_template(request.match_info["name"]))


async def update_email_template(request: web.Request, account: SesAccount) -> web.StreamResponse:
    name = request.match_info["name"]
    _, content = parse_template_request(await _json_body(request), path_name=name)
    account.update_template(name, content)
    return ses_json({})


async def test_render_email_template(
    request: web.Request, account: SesAccount
) -> web.StreamResponse:
    body = await _json_body(request)
    try:
        data = parse_template_data(body.get("TemplateData"), "TemplateData")
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    rendered = account.render_template(request.match_info["name"], data)
    return ses_json({"RenderedTemplate": rendered})


async def delete_email_template(request: web.Request, account: SesAccount) -> web.StreamResponse:
    account.delete_template(request.match_info["name"])
    return ses_json({})


async def get_account(request: web.Request, account: SesAccount) -> web.StreamResponse:
    return ses_json(account.account(time.time()))


# Configuration sets and event destinations: stored and answered (`config_sets.py`).


async def create_configuration_set(request: web.Request, account: SesAccount) -> web.StreamResponse:
    account.configuration_sets.create(await _json_body(request))
    return ses_json({})


async def get_configuration_set(request: web.Request, account: SesAccount) -> web.StreamResponse:
    return ses_json(account.configuration_sets.get(request.match_info["name"]))


async def delete_configuration_set(request: web.Request, account: SesAccount) -> web.StreamResponse:
    account.configuration_sets.delete(request.match_info["name"])
    return ses_json({})


async def create_event_destination(request: web.Request, account: SesAccount) -> web.StreamResponse:
    body = await _json_body(request)
    dest = body.get("EventDestinationName")
    if not isinstance(dest, str):
        raise BadRequest("EventDestinationName is required.")
    account.configuration_sets.put_destination(
        request.match_info["name"], dest, body.get("EventDestination"), create=True
    )
    return ses_json({})


async def get_event_destinations(request: web.Request, account: SesAccount) -> web.StreamResponse:
    return ses_json(account.configuration_sets.destinations(request.match_info["name"]))


async def update_event_destination(request: web.Request, account: SesAccount) -> web.StreamResponse:
    m = request.match_info
    body = await _json_body(request)
    account.configuration_sets.put_destination(
        m["name"], m["dest"], body.get("EventDestination"), create=False
    )
    return ses_json({})


async def delete_event_destination(request: web.Request, account: SesAccount) -> web.StreamResponse:
    m = request.match_info
    account.configuration_sets.delete_destination(m["name"], m["dest"])
    return ses_json({})


def _by_target(sms: Handler, push: Handler) -> Handler:
    async def dispatch(request: web.Request) -> web.StreamResponse:
        if is_query_request(request):
            return await push(request)
        target = request.headers.get("X-Amz-Target", "")
        if target.startswith(FIREHOSE_TARGET):
            return await firehose_call(request, target.removeprefix(FIREHOSE_TARGET))
        return await sms(request)

    return dispatch


async def firehose_call(request: web.Request, operation: str) -> web.StreamResponse:
    """One Firehose control-plane call (`firehose.py`), JSON 1.1 in and out."""
    account = request.app[ACCOUNT]
    headers = {"x-amzn-RequestId": str(uuid.uuid4())}
    try:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        if not isinstance(body, dict):
            raise FirehoseError("SerializationException", "Body must be a JSON object.")
        answer, status = account.firehose.call(operation, body, time.time()), 200
    except ValueError:
        answer, status = FirehoseError("SerializationException", "Body is not JSON.").body(), 400
    except FirehoseError as exc:
        answer, status = exc.body(), 400
        headers["x-amzn-ErrorType"] = exc.code
    return web.Response(
        body=_dumps(answer).encode(),
        status=status,
        headers=headers,
        content_type=FIREHOSE_CONTENT_TYPE,
    )


def _ses(operation: Operation) -> Handler:
    """Wrap an operation with injected latency and SES error translation."""

    async def handler(request: web.Request) -> web.StreamResponse:
        account = request.app[ACCOUNT]
        delay = account.latency_s()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            return await operation(request, account)
        except SesError as exc:
            return ses_error(exc)

    handler.__name__ = operation.__name__
    return handler


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise BadRequest("Request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.")
    return body


async def _hold_open(request: web.Request, account: SesAccount) -> web.StreamResponse:
    """Never answer: wait until the client disconnects (its read timeout), then drop it.

    If the client is still waiting after `hang_max_s`, or the server is stopping, the
    connection is closed without an answer: the sender must not learn the outcome.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + account.config.hang_max_s
    stopping = request.app[STOPPING]
    while loop.time() < deadline and not stopping.is_set():
        transport = request.transport
        if transport is None or transport.is_closing():
            break
        await asyncio.sleep(HANG_POLL_S)
    transport = request.transport
    if transport is not None and not transport.is_closing():
        transport.abort()
    # Written to a closed transport: aiohttp drops it ("premature client disconnection").
    return ses_error(SesError("Request timed out."))


async def _on_shutdown(app: web.Application) -> None:
    app[STOPPING].set()
