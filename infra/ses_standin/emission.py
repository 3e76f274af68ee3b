"""Event publishing of the stand-in: the `on_accepted` hook, SNS subscriptions, the admin API.

SMS messages accepted with a configuration set publish their TEXT_* event to that set's
subscriptions, and replies to a two-way number go to every subscription of its topic
(`on_text_accepted`, `on_inbound`): built here, signed and delivered by the same emitter.

The hook runs inside the SES request handler, so it only decides each recipient's outcome
(a hash, ~1 µs), remembers what was injected (for tests and benchmarks) and appends to a
buffer; a background task hands the buffer in batches to the emitter child process
(`emitter.py`), which builds, signs and POSTs the notifications. Nothing of that runs on the
send path, and a slow or dead webhook never slows SendBulkEmail: when the emitter falls behind,
the buffer is capped and the excess counted as dropped, as a real SNS topic would drop
after its retry window.

| route                                         | what                                         |
|-----------------------------------------------|----------------------------------------------|
| POST /_admin/subscriptions                    | subscribe an endpoint (sends a signed        |
|                                               | SubscriptionConfirmation)                    |
| GET  /_admin/subscriptions                    | subscriptions with delivery statistics       |
| DELETE /_admin/subscriptions/{id}             | unsubscribe                                  |
| GET/POST /_admin/feedback/rates               | bounce/complaint… shares, per configuration  |
|                                               | set (`configuration_set`, default `*`)       |
| GET/POST /_admin/feedback/engagement          | open/click shares per template (`template`,  |
|                                               | default `*`): Open and Click events          |
| GET  /_admin/feedback?campaign=C              | addresses given each outcome, per campaign   |
| GET  /?Action=ConfirmSubscription&…           | the SubscribeURL (as on sns.<region>…)       |
| GET  /?Action=Unsubscribe&SubscriptionArn=…   | the UnsubscribeURL of every notification     |
| GET  /_sns/{name}.pem                         | the signing certificate (SigningCertURL)     |
| GET  /_admin/firehose                         | Firehose event destinations and each stream's|
|                                               | deliveries (delivered, retried, dropped)     |

Configuration sets whose event destination is a Firehose delivery stream (`config_sets.py`,
`firehose.py`) publish there too: the hook tags the message with those destinations
(`routes`), and the emitter buffers the events per stream and POSTs them in batches
(`firehose_delivery.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web

from infra.ses_standin.config_sets import ConfigurationSets
from infra.ses_standin.errors import BadRequest
from infra.ses_standin.feedback_plan import (
    DELIVERED,
    Engagement,
    FeedbackRates,
    engagement_of,
    message_rejected,
    recipient_outcome,
)
from infra.ses_standin.firehose import DeliveryStreams
from infra.ses_standin.journal import Record
from infra.ses_standin.recipients import parse_address
from infra.ses_standin.sms import SmsRecord
from infra.ses_standin.subscriptions import SubscriptionStore, parse_request
from infra.ses_standin.text_events import TEXT_DELIVERED, text_event
from producers.sns_sign import generate_signing_key

log = logging.getLogger("infra.ses_standin.emission")

FLUSH_EVERY_S = 0.02
MAX_BUFFER = 200_000  # messages waiting for the emitter; beyond, dropped (and counted)
# SNS signs with 2048-bit keys; the verifier takes any RSA key, and a 1024-bit signature costs
# a third of the CPU, which the stand-in would otherwise take from the product it measures.
SIGNING_KEY_BITS = 1024
BACKLOG_FILE = "undelivered-events.jsonl"
STOP_WAIT_S = 3.0  # for the emitter to exit after stdin closes (then it is killed)
SAVE_WAIT_S = 60.0  # … when it writes its backlog first
STATS_LINE_LIMIT = 64 * 1024 * 1024  # bytes per emitter stats line (asyncio default: 64 KiB)
MAX_LISTED = 200_000  # addresses remembered per campaign and outcome
ALL = "*"


class EventEmission:
    """`resume_backlog`: the emitter writes what it has not delivered when it stops, and the
    next start sends it; otherwise it is dropped at stop (and a file left over is deleted at
    start), so a restarted stand-in never spends CPU on an old campaign's events."""

    def __init__(
        self, state_dir: Path, *, region: str = "us-east-1", resume_backlog: bool = False
    ) -> None:
        self.state_dir = state_dir
        self.region = region
        self.resume_backlog = resume_backlog
        self.subscriptions = SubscriptionStore(state_dir / "subscriptions.json")
        self.rates: dict[str, FeedbackRates] = {ALL: FeedbackRates()}
        self.engagement: dict[str, Engagement] = {ALL: Engagement()}  # by template
        self.base_url = ""
        self.injected: dict[str, dict[str, list[str]]] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.emitter_stats: dict[str, Any] = {}
        self.dropped = 0
        self.planned = 0
        self._buffer: list[dict[str, Any]] = []
        self._notes: list[dict[str, Any]] = []  # ready-made messages: SMS events and replies
        self._wake = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._active = self.subscriptions.confirmed()
        self._sets: ConfigurationSets | None = None
        self._streams: DeliveryStreams | None = None
        self._routes: dict[str, dict[str, Any]] = {}  # Firehose destinations to live streams
        self._routes_by_set: dict[str, list[str]] = {}
        self._firehose_changed = False

    # ---- Firehose event destinations ------------------------------------------------------

    def attach_firehose(self, sets: ConfigurationSets, streams: DeliveryStreams) -> None:
        """Publish to the delivery streams the configuration sets' event destinations name,
        following every change of either."""
        self._sets, self._streams = sets, streams
        sets.on_change.append(self._reroute)
        streams.on_change.append(self._reroute)
        self._reroute()

    def _reroute(self) -> None:
        assert self._sets is not None and self._streams is not None
        routes: dict[str, dict[str, Any]] = {}
        by_set: dict[str, list[str]] = {}
        for route_id, route in self._sets.firehose_routes().items():
            stream = self._streams.by_arn(route["stream_arn"])
            if stream is None:  # SES cannot put records to a missing stream: they are lost
                log.warning(
                    "firehose_stream_missing destination=%s arn=%s", route_id, route["stream_arn"]
                )
                continue
            routes[route_id] = {**route, "stream": stream}
            by_set.setdefault(route["configuration_set"], []).append(route_id)
        self._routes, self._routes_by_set = routes, by_set
        self._firehose_changed = True
        self._wake.set()

    def _firehose_op(self) -> dict[str, Any]:
        assert self._streams is not None
        names = sorted({r["stream"] for r in self._routes.values()})
        return {
            "op": "firehose",
            "streams": [self._streams.delivery_config(n) for n in names],
            "routes": {
                i: {"stream": r["stream"], "event_types": r["event_types"]}
                for i, r in self._routes.items()
            },
        }

    # ---- the send-path hook ---------------------------------------------------------------

    def on_accepted(self, record: Record) -> None:
        if not self._active and not self._routes_by_set:
            return
        configuration_set = record.get("configuration_set")
        subs = [s.id for s in self._active if s.matches(configuration_set)]
        routes = self._routes_by_set.get(configuration_set or "")
        if not subs and not routes:
            return
        rates = self.rates.get(configuration_set or "", self.rates[ALL])
        campaign = str((record.get("tags") or {}).get("campaign", ""))
        template = str(record.get("template") or "")
        engagement = self.engagement.get(template, self.engagement[ALL])
        plan = []
        engaged: dict[str, str] = {}
        for given in (*record["destination"], *record.get("cc", ()), *record.get("bcc", ())):
            key = _key(given)
            outcome = recipient_outcome(key, rates)
            plan.append((given, outcome))
            self._remember(campaign, outcome, key)
            how = engagement_of(key, outcome, template, engagement, rates.salt)
            if how is not None:
                engaged[given] = how
                self._remember(campaign, f"{how}:{template}", key)
        if len(self._buffer) >= MAX_BUFFER:
            self.dropped += 1
            return
        rejected = message_rejected(record["message_id"], rates)
        if rejected:
            self._remember(campaign, "rejected", record["message_id"])
        item = {"record": record, "plan": plan, "rejected": rejected, "subs": subs}
        if routes:
            item["routes"] = routes
        if engaged:
            item["engaged"] = engaged
        self._buffer.append(item)
        self.planned += 1
        if len(self._buffer) >= 500:
            self._wake.set()

    def on_text_accepted(self, record: SmsRecord) -> None:
        """An accepted SMS: its TEXT_DELIVERED event to the subscriptions of its configuration
        set (none without one: SMS events leave through a configuration set's destination)."""
        if not self._active or record.configuration_set is None:
            return
        subs = [
            s.id
            for s in self._active
            if s.matches(record.configuration_set) and s.wants(TEXT_DELIVERED)
        ]
        if subs:
            body = json.dumps(text_event(record, TEXT_DELIVERED, int(time.time() * 1000)))
            self._note(subs, body)

    def on_inbound(self, payload: dict[str, Any], topic_arn: str) -> None:
        """A reply to a two-way number: its payload to every subscription of the topic."""
        subs = [s.id for s in self._active if s.topic_arn == topic_arn]
        if subs:
            self._note(subs, json.dumps(payload))

    def _note(self, subs: list[str], body: str) -> None:
        if len(self._notes) >= MAX_BUFFER:
            self.dropped += 1
            return
        self._notes.append({"subs": subs, "body": body})
        self.planned += 1

    def _remember(self, campaign: str, outcome: str, value: str) -> None:
        counts = self.counts.setdefault(campaign, {})
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == DELIVERED:
            return
        listed = self.injected.setdefault(campaign, {}).setdefault(outcome, [])
        if len(listed) < MAX_LISTED:
            listed.append(value)

    # ---- the emitter process --------------------------------------------------------------

    async def start(self, base_url: str) -> None:
        """Called once the server listens (the URLs in every envelope need its address)."""
        self.base_url = base_url.rstrip("/")
        self._tasks.append(asyncio.create_task(self._flusher(), name="emission-flush"))
        backlog = self.backlog_path
        if backlog.exists() and not self.resume_backlog:
            with backlog.open("rb") as lines:
                old = sum(1 for _ in lines)
            backlog.unlink()
            log.warning("events_backlog_dropped events=%d (start with --resume-events)", old)
        if self.subscriptions.all() or self._routes:
            await self._ensure_emitter()
        if backlog.exists():
            await self._send({"op": "resume", "path": str(backlog)})

    @property
    def backlog_path(self) -> Path:
        return self.state_dir / BACKLOG_FILE

    @property
    def cert_path(self) -> Path:
        return self.state_dir / "sns-signing-cert.pem"

    def cert_url(self) -> str:
        digest = hashlib.sha256(self.cert_path.read_bytes()).hexdigest()[:32]
        return f"{self.base_url}/_sns/SimpleNotificationService-{digest}.pem"

    async def _ensure_emitter(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            return
        key_path = self.state_dir / "sns-signing-key.pem"
        if not self.cert_path.exists() or _key_bits(key_path) != SIGNING_KEY_BITS:
            private_pem, cert_pem = await asyncio.to_thread(
                generate_signing_key,
                common_name="sns.flashsend-standin.invalid",
                key_size=SIGNING_KEY_BITS,
            )
            self.state_dir.mkdir(parents=True, exist_ok=True)
            key_path.write_bytes(private_pem)
            key_path.chmod(0o600)
            self.cert_path.write_bytes(cert_pem)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "infra.ses_standin.emitter",
            "--key",
            str(key_path),
            "--cert-url",
            self.cert_url(),
            "--base-url",
            self.base_url,
            "--region",
            self.region,
            *(["--backlog-file", str(self.backlog_path)] if self.resume_backlog else []),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            # A stats line lists every subscription the emitter has served; past asyncio's
            # default 64 KiB line limit the reader died, the pipe filled and the emitter
            # blocked on its own stdout (no more deliveries, `pending` frozen).
            limit=STATS_LINE_LIMIT,
        )
        self._tasks.append(asyncio.create_task(self._read_stats(self._proc), name="emission-stats"))
        await self._send_subs()
        if self._streams is not None:
            self._firehose_changed = False
            await self._send(self._firehose_op())
        log.info("emitter_started pid=%s", self._proc.pid)

    async def _send(self, op: Mapping[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            return
        proc.stdin.write(json.dumps(op, separators=(",", ":")).encode() + b"\n")
        await proc.stdin.drain()

    async def _flusher(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FLUSH_EVERY_S)
            self._wake.clear()
            if self._firehose_changed:  # before any message that names a new destination
                self._firehose_changed = False
                try:
                    if self._routes:  # no emitter is started for a change that routes nothing
                        await self._ensure_emitter()  # a new one is sent the routes at start
                    await self._send(self._firehose_op())
                except (OSError, ConnectionError) as exc:
                    self._firehose_changed = True
                    log.warning("emitter_write_failed %s", exc)
            for op, items in (("msgs", self._buffer), ("notes", self._notes)):
                if not items:
                    continue
                if op == "msgs":
                    self._buffer = []
                else:
                    self._notes = []
                try:
                    await self._ensure_emitter()
                    await self._send({"op": op, "items": items})
                except (OSError, ConnectionError) as exc:  # emitter died: restarted next time
                    self.dropped += len(items)
                    log.warning("emitter_write_failed %s", exc)

    async def _read_stats(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except ValueError:  # a line over the limit: skip it, keep draining the pipe
                log.warning("emitter_stats_line_too_long")
                continue
            if not line:
                break
            with contextlib.suppress(ValueError):
                self.emitter_stats = json.loads(line)
        log.warning("emitter_exited code=%s", await proc.wait())

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()  # the emitter stops at once (keeping its backlog if asked)
            try:
                await asyncio.wait_for(
                    proc.wait(), SAVE_WAIT_S if self.resume_backlog else STOP_WAIT_S
                )
            except TimeoutError:
                proc.kill()
                await proc.wait()

    # ---- HTTP -----------------------------------------------------------------------------

    def register(self, app: web.Application) -> None:
        router = app.router
        router.add_post("/_admin/subscriptions", self.subscribe)
        router.add_get("/_admin/subscriptions", self.list_subscriptions)
        router.add_delete("/_admin/subscriptions/{id}", self.unsubscribe)
        router.add_get("/_admin/feedback/rates", self.get_rates)
        router.add_post("/_admin/feedback/rates", self.set_rates)
        router.add_get("/_admin/feedback/engagement", self.get_engagement)
        router.add_post("/_admin/feedback/engagement", self.set_engagement)
        router.add_get("/_admin/feedback", self.feedback)
        router.add_get("/_admin/firehose", self.firehose)
        router.add_get("/", self.sns_action)
        router.add_get("/_sns/{name}", self.certificate)
        app.on_cleanup.append(lambda _app: self.stop())

    async def subscribe(self, request: web.Request) -> web.Response:
        try:
            parsed = parse_request(json.loads(await request.read() or b"{}"))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        sub, confirm = self.subscriptions.subscribe(parsed, time.time())
        await self._ensure_emitter()
        await self._send_subs()
        if confirm:
            url = (
                f"{self.base_url}/?Action=ConfirmSubscription&TopicArn={quote(sub.topic_arn)}"
                f"&Token={sub.token}"
            )
            await self._send({"op": "confirm", "sub": sub.to_dict(), "subscribe_url": url})
        return web.json_response(self._describe(sub.id))

    async def _send_subs(self) -> None:
        """After any change: the hook's list and the emitter's list of confirmed subs."""
        self._active = self.subscriptions.confirmed()
        await self._send({"op": "subs", "subs": [s.to_dict() for s in self._active]})

    def _describe(self, sub_id: str) -> dict[str, Any]:
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            return {}
        data = sub.to_dict()
        data.pop("token")
        data["delivery"] = self.emitter_stats.get("subs", {}).get(sub_id, {})
        return data

    async def list_subscriptions(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "subscriptions": [self._describe(s.id) for s in self.subscriptions.all()],
                "buffered": len(self._buffer) + len(self._notes),
                "pending": int(self.emitter_stats.get("pending", 0))
                + len(self._buffer)
                + len(self._notes),
                "events": self.emitter_stats.get("events", 0),
                "overflow": self.emitter_stats.get("overflow", 0),
                "dropped": self.dropped,
                "firehose": self.emitter_stats.get("firehose", {}),  # per delivery stream
                "planned_messages": self.planned,
                "certificate_url": self.cert_url() if self.cert_path.exists() else None,
            }
        )

    async def unsubscribe(self, request: web.Request) -> web.Response:
        found = self.subscriptions.delete(request.match_info["id"])
        await self._send_subs()
        return web.json_response({"deleted": found}, status=200 if found else 404)

    async def get_rates(self, request: web.Request) -> web.Response:
        return web.json_response({k: v.to_dict() for k, v in self.rates.items()})

    async def set_rates(self, request: web.Request) -> web.Response:
        try:
            changes = json.loads(await request.read() or b"{}")
            if not isinstance(changes, dict):
                raise ValueError("body must be a JSON object")
            scope = str(changes.pop("configuration_set", None) or ALL)
            if changes.pop("clear", False):
                if scope != ALL:
                    self.rates.pop(scope, None)
                return web.json_response({"configuration_set": scope, "cleared": True})
            self.rates[scope] = self.rates.get(scope, self.rates[ALL]).updated(changes)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"configuration_set": scope, **self.rates[scope].to_dict()})

    async def get_engagement(self, request: web.Request) -> web.Response:
        return web.json_response({k: v.to_dict() for k, v in self.engagement.items()})

    async def set_engagement(self, request: web.Request) -> web.Response:
        """`{"template": "sale_b", "p_open": 0.4, "p_click": 0.1}`; without `template`, every
        template that has no setting of its own; `{"clear": true}` forgets them all."""
        try:
            body = json.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            if body.pop("clear", False):
                self.engagement = {ALL: Engagement()}
                return web.json_response({"cleared": True})
            template = str(body.pop("template", None) or ALL)
            self.engagement[template] = Engagement.parse(body)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"template": template, **self.engagement[template].to_dict()})

    async def feedback(self, request: web.Request) -> web.Response:
        campaign = request.query.get("campaign", "")
        return web.json_response(
            {
                "campaign": campaign,
                "counts": self.counts.get(campaign, {}),
                "addresses": self.injected.get(campaign, {}),
            }
        )

    async def firehose(self, request: web.Request) -> web.Response:
        """The Firehose event destinations in force and each stream's delivery statistics."""
        return web.json_response(
            {
                "routes": self._routes,
                "streams": self.emitter_stats.get("firehose", {}),
                "pending": int(self.emitter_stats.get("pending", 0))
                + len(self._buffer)
                + len(self._notes),
            }
        )

    async def sns_action(self, request: web.Request) -> web.Response:
        """The SubscribeURL and UnsubscribeURL, on the path SNS uses (`/?Action=…`)."""
        action = request.query.get("Action")
        if action == "ConfirmSubscription":
            sub = self.subscriptions.confirm(
                request.query.get("TopicArn", ""), request.query.get("Token", "")
            )
            if sub is None:
                return _xml_error("InvalidParameter", "Invalid token", 400)
            await self._send_subs()
            log.info("subscription_confirmed id=%s endpoint=%s", sub.id, sub.endpoint)
            return _xml(
                "ConfirmSubscriptionResponse",
                f"<ConfirmSubscriptionResult><SubscriptionArn>{sub.arn}</SubscriptionArn>"
                "</ConfirmSubscriptionResult>",
            )
        if action == "Unsubscribe":
            if not self.subscriptions.delete_by_arn(request.query.get("SubscriptionArn", "")):
                return _xml_error("NotFound", "Subscription does not exist", 404)
            await self._send_subs()
            return _xml("UnsubscribeResponse", "")
        return _xml_error("InvalidAction", f"unknown action {action!r}", 400)

    async def certificate(self, request: web.Request) -> web.Response:
        if not self.cert_path.exists() or request.path != _path(self.cert_url()):
            return web.Response(status=404, text="no such certificate")
        return web.Response(body=self.cert_path.read_bytes(), content_type="application/x-pem-file")


def _key_bits(path: Path) -> int | None:
    """Size of the RSA key at `path`, None if there is none (or it cannot be read)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    return key.key_size if isinstance(key, rsa.RSAPrivateKey) else None


def _key(address: str) -> str:
    try:
        return parse_address(address, "destination")[1]
    except BadRequest:
        return address.lower()


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[-1].split("/", 1)[-1]


def _xml(root: str, inner: str) -> web.Response:
    body = (
        f'<{root} xmlns="http://sns.amazonaws.com/doc/2010-03-31/">{inner}'
        f"<ResponseMetadata><RequestId>standin</RequestId></ResponseMetadata></{root}>"
    )
    return web.Response(text=body, content_type="text/xml")


def _xml_error(code: str, message: str, status: int) -> web.Response:
    body = (
        '<ErrorResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><Error>'
        f"<Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>"
        "</ErrorResponse>"
    )
    return web.Response(text=body, status=status, content_type="text/xml")
