"""The SES stand-in's SNS emitter stops with the stand-in (`flashsend down`, or the stand-in
killed), and a restarted stand-in does not resume an old backlog unless asked to."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest

from flashsend.lab.feedback_run import wait_for
from flashsend.settings import Settings
from infra.process import free_port
from infra.ses_standin.emission import BACKLOG_FILE
from infra.ses_standin.events_admin import SesEventsAdmin
from infra.stack import SesStandin
from sinks.ses import BulkEntry, SesSender, make_client
from tests.conftest import LocalStack
from tests.integration.campaign_helpers import put_template


class Endpoint:
    """Confirms its subscription, then answers `status` to every notification, recording the
    MessageIds it was offered."""

    def __init__(self) -> None:
        self.status = 503
        self.offered: list[str] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = 200
                if body["Type"] == "SubscriptionConfirmation":
                    import urllib.request

                    urllib.request.urlopen(body["SubscribeURL"], timeout=10).read()
                else:
                    endpoint.offered.append(body["MessageId"])
                    status = endpoint.status
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/sns"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint()
    yield e
    e.close()


@pytest.fixture
def own_standin(stack: LocalStack, tmp_path: Path) -> Iterator[Settings]:
    """A stand-in of this test's own (state dir, port): the test stops and restarts it."""
    settings = stack.settings_for(state_dir=tmp_path, ses_port=free_port(), ses_endpoint=None)
    SesStandin(settings).start()
    yield settings
    SesStandin(settings).stop()


def emitter_of(settings: Settings) -> psutil.Process | None:
    pid = SesStandin(settings).process.pid()
    if pid is None:
        return None
    for child in psutil.Process(pid).children():
        if "infra.ses_standin.emitter" in " ".join(child.cmdline()):
            return child
    return None


def backlog_of(settings: Settings, endpoint: Endpoint) -> tuple[SesEventsAdmin, str]:
    """Subscribe `endpoint` (answering 503) and send 100 recipients: the emitter holds them."""
    assert settings.ses_endpoint_url
    events = SesEventsAdmin(settings.ses_endpoint_url)
    config_set = f"cs-{uuid.uuid4().hex[:8]}"
    topic = f"arn:aws:sns:us-east-1:000000000000:emitter-{uuid.uuid4().hex[:8]}"
    sub = events.subscribe(endpoint.url, topic, configuration_sets=[config_set])
    events.wait_confirmed(sub["id"])
    put_template(settings)
    ses = SesSender(make_client(settings, timeout=10))
    before = len(endpoint.offered)
    for batch in range(2):
        entries = [BulkEntry(f"e{batch}-{i}@example.com", {"first_name": "An"}) for i in range(50)]
        ses.send_bulk(
            from_address="Sale <sale@news.flashsend.test>",
            template="flash_sale",
            entries=entries,
            configuration_set=config_set,
        )
    wait_for("events offered and refused", lambda: len(endpoint.offered) >= before + 50, 30)
    return events, sub["id"]


def test_the_emitter_stops_with_the_standin_and_its_backlog_is_dropped(
    own_standin: Settings, endpoint: Endpoint
) -> None:
    backlog_of(own_standin, endpoint)
    emitter = emitter_of(own_standin)
    assert emitter is not None
    assert SesStandin(own_standin).stop()
    assert not emitter.is_running()
    assert not (own_standin.state_dir / "ses" / "events" / BACKLOG_FILE).exists()

    SesStandin(own_standin).start()  # `flashsend up` again, without --resume-ses-events
    offered = len(endpoint.offered)
    time.sleep(3)  # the 503s were retried every few tenths of a second before the stop
    assert len(endpoint.offered) == offered


def test_an_orphaned_emitter_exits(own_standin: Settings, endpoint: Endpoint) -> None:
    backlog_of(own_standin, endpoint)
    emitter = emitter_of(own_standin)
    assert emitter is not None
    pid = SesStandin(own_standin).process.pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # no chance to close the emitter's stdin politely
    emitter.wait(timeout=10)


def test_the_backlog_is_resumed_only_when_asked(own_standin: Settings, endpoint: Endpoint) -> None:
    SesStandin(own_standin).stop()
    keeping = own_standin.model_copy(update={"ses_resume_events": True})
    SesStandin(keeping).start()
    events, sub_id = backlog_of(keeping, endpoint)
    SesStandin(keeping).stop()
    backlog = keeping.state_dir / "ses" / "events" / BACKLOG_FILE
    with backlog.open() as lines:
        kept = sum(1 for _ in lines)
    assert kept == 200  # Send + Delivery for each of the 100 recipients, none delivered yet

    endpoint.status = 200
    SesStandin(keeping).start()
    wait_for(
        "the kept backlog delivered",
        lambda: (events.subscription(sub_id) or {}).get("delivery", {}).get("delivered") == kept,
        60,
    )
    assert not backlog.exists()

    endpoint.status = 503  # a second backlog, and a start without the flag: dropped
    backlog_of(keeping, endpoint)
    SesStandin(keeping).stop()
    assert backlog.exists()
    SesStandin(own_standin).start()
    assert not backlog.exists()
    offered = len(endpoint.offered)
    time.sleep(2)
    assert len(endpoint.offered) == offered


def test_the_stacks_subscription_matches_the_configured_event_types(
    settings: Settings, endpoint: Endpoint
) -> None:
    from infra.aws_plan import SMS_EVENT_TYPES
    from infra.webhook_service import subscribe_local

    s = settings.model_copy(
        update={
            "sns_topic_arns": (f"arn:aws:sns:us-east-1:000000000000:t-{uuid.uuid4().hex[:8]}",),
            "ses_event_types": ("Send", "Delivery", "Bounce", "Complaint", "Open", "Subscription"),
        }
    )
    sub = subscribe_local(s, endpoint=endpoint.url)
    try:
        # Subscription is configured, but the stand-in never publishes it: not asked for.
        assert sub["event_types"] == [
            *("Send", "Delivery", "Bounce", "Complaint", "Open"),
            *SMS_EVENT_TYPES,
        ]
    finally:
        assert s.ses_endpoint_url
        SesEventsAdmin(s.ses_endpoint_url).unsubscribe(sub["id"])
