"""A Kafka outage during a campaign loses no bounce or complaint (`flashsend feedback outage`).

1. `users` opted-in users; the SES stand-in makes `p_bounce` of them hard bounce and
   `p_complaint` complain (this run's configuration set only).
2. The ingest path under test: `sqs` (the stand-in's raw SQS subscription → ElasticMQ → a
   `flashsend events pull` process) or `webhook` (signed SNS POSTs → a `flashsend webhook`
   process, which answers 503 while the broker is down, and the stand-in retries as SNS does).
3. A feedback worker and campaign workers; the campaign starts; once `outage_when_sent` of the
   users were sent, the stack's Kafka broker is stopped for `seconds`, then started again. The
   workers keep sending the recipients they had already fetched, so SES events go on arriving
   while the broker is down.
4. Once the campaign is over and every event is through (stand-in drained, queue empty,
   feedback group caught up): the suppression table must hold exactly the addresses the
   stand-in bounced or complained — nothing lost, nothing extra.

The automatic pause is off (min sample out of reach) so the campaign runs to its end.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashsend.errors import UsageError
from flashsend.lab.feedback_run import (
    WebhookProcess,
    campaign_row,
    feedback_lag,
    in_scratch,
    insert_users,
    suppressed,
    wait_for,
)
from flashsend.lab.run import StartedCampaigns, finish_run
from flashsend.lab.sqs_run import PullerProcess, queue_depth, wait_queue_empty, with_sqs
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.aws_apply import ensure_local_queues
from infra.kafka import KafkaBroker
from infra.ses_standin.admin import SesStandinAdmin
from infra.ses_standin.events_admin import SesEventsAdmin
from infra.ses_standin.sqs_admin import SqsSinkAdmin
from producers.campaign import start_campaign
from producers.campaign_ops import create_campaign
from producers.mail_topics import ensure_mail_topics
from producers.sqs_client import boto3_sqs
from sinks.ses import SesSender, make_client

TEMPLATE = ("feedback_outage", "{{first_name}}, flash sale", "<p>Hi {{first_name}}</p>", "Hi")
PATHS = ("sqs", "webhook")


@dataclass(frozen=True)
class OutageOptions:
    seconds: float = 180.0
    path: str = "sqs"
    users: int = 20_000
    rate: float = 200.0
    p_bounce: float = 0.02
    p_complaint: float = 0.003
    workers: int = 1
    outage_when_sent: float = 0.1  # share of the users sent before the broker is stopped
    timeout_s: float = 900.0


def run_outage_scratch(
    settings: Settings, options: OutageOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """On the running stack, in a scratch database (kept for inspection: see the result)."""
    scratch, log_dir = in_scratch(settings, "outage", log)
    return run_outage(scratch, options, log, log_dir=log_dir)


def run_outage(
    settings: Settings,
    options: OutageOptions,
    log: Callable[[str], None] = print,
    *,
    log_dir: Path,
) -> dict[str, Any]:
    o = options
    if o.path not in PATHS:
        raise UsageError(f"--path must be one of {PATHS}")
    if not settings.ses_endpoint_url:
        raise UsageError("needs the SES stand-in (it injects the bounces and complaints)")
    broker = KafkaBroker(settings)
    if not broker.running():
        raise UsageError(
            f"the Kafka broker is not a local service of the stack in {settings.state_dir}: "
            "this run stops and starts it"
        )
    s = with_sqs(settings, feedback_min_sample=10**9)
    run = uuid.uuid4().hex[:8]
    domain = f"outage-{run}.flashsend.test"
    began = time.monotonic()
    events = SesEventsAdmin(settings.ses_endpoint_url)
    sink = SqsSinkAdmin(settings.ses_endpoint_url)
    result: dict[str, Any] = {
        "path": o.path,
        "outage_s_asked": o.seconds,
        "users": o.users,
        "database": s.pg_database,
    }
    insert_users(s, o.users, domain)
    SesSender(make_client(s, timeout=10)).put_template(*TEMPLATE)
    ensure_mail_topics(s)
    events.set_rates(
        configuration_set=s.marketing_configuration_set,
        p_bounce=o.p_bounce,
        p_complaint=o.p_complaint,
        salt=run,
    )
    puller: PullerProcess | None = None
    webhook: WebhookProcess | None = None
    sub_id: str | None = None
    feedback = WorkerPool(s, log_dir, loglevel="info", role="feedback")
    senders = WorkerPool(s, log_dir, loglevel="warning")
    started = StartedCampaigns(s)
    failure: BaseException | None = None
    try:
        if o.path == "sqs":
            ensure_local_queues(s)
            puller = PullerProcess.start(s, log_dir)
        else:
            webhook = WebhookProcess.start(s, log_dir)
            sub = events.subscribe(
                webhook.sns_url,
                s.sns_topic_arns[0],
                configuration_sets=[s.marketing_configuration_set],
                signature_version=2,
            )
            sub_id = sub["id"]
            events.wait_confirmed(sub_id)
        feedback.start(1)
        senders.start(o.workers)
        cid = started.add(create_campaign(s, name="outage", template=TEMPLATE[0], rate=o.rate))
        start_campaign(s, cid)
        log(f"campaign {cid} started at {o.rate:g}/s to {o.users:,} users, path {o.path}")
        wait_for(
            f"{o.outage_when_sent:.0%} of the campaign sent",
            lambda: campaign_row(s, cid)["counts"].get("sent", 0) >= o.outage_when_sent * o.users,
            o.timeout_s,
            0.2,
        )
        before = campaign_row(s, cid)["counts"].get("sent", 0)
        log(f"stopping the Kafka broker for {o.seconds:g}s ({before:,} sent so far)")
        down_wall = time.time()
        t_down = time.monotonic()
        broker.stop()
        # The queue is sampled until the broker is back: its start (seconds on a busy
        # machine) is part of the outage the events wait out.
        held = [0]
        back = threading.Event()

        def sample_queue() -> None:
            while not back.wait(1.0):
                with contextlib.suppress(Exception):  # a missed sample is only a lower max
                    held[0] = max(held[0], sum(queue_depth(s).values()))

        sampler = threading.Thread(target=sample_queue, name="sqs-depth", daemon=True)
        if puller is not None:
            sampler.start()
        time.sleep(o.seconds)
        restarting = time.monotonic()
        try:
            broker.start()
        finally:
            back.set()
            if sampler.is_alive():
                sampler.join(timeout=10)
        result["broker_start_s"] = round(time.monotonic() - restarting, 1)
        up_wall = time.time()
        result["outage_s"] = round(time.monotonic() - t_down, 1)
        log(f"broker back after {result['outage_s']}s")
        restarts = _replace_dead(senders) + _replace_dead(feedback)

        def settled() -> dict[str, Any] | None:
            row = campaign_row(s, cid)
            counts = row["counts"]
            return row if counts.get("pending", 0) + counts.get("sending", 0) == 0 else None

        row = wait_for(f"campaign {cid} to finish", settled, o.timeout_s, 0.5)
        if o.path == "sqs":
            sink.wait_drained(timeout=o.timeout_s)
            wait_queue_empty(s, o.timeout_s)
        else:
            events.wait_drained(timeout=o.timeout_s)
        wait_for("feedback group caught up", lambda: feedback_lag(s) == 0, o.timeout_s)
        source = sink if o.path == "sqs" else events
        injected = {
            outcome: [a for a in addresses if a.endswith("@" + domain)]
            for outcome, addresses in source.feedback(str(cid))["addresses"].items()
        }
        expected = {a: "bounce" for a in injected.get("bounce", [])}
        expected.update({a: "complaint" for a in injected.get("complaint", [])})
        got = suppressed(s)
        during = sum(
            n
            for at, n in SesStandinAdmin(settings.ses_endpoint_url).rate(str(cid))
            if down_wall <= at < up_wall
        )
        result.update(
            campaign={"id": cid, "status": row["status"], "rows": row["counts"]},
            sent_before_outage=before,
            recipients_sent_during_outage=during,
            injected_bounces=len(injected.get("bounce", [])),
            injected_complaints=len(injected.get("complaint", [])),
            suppressed=len(got),
            lost=sorted(set(expected) - set(got))[:20],
            extra=sorted(set(got) - set(expected))[:20],
            worker_restarts=restarts,
        )
        if puller is not None:
            result["events_held_in_sqs_max"] = held[0]
        result["ok"] = bool(got == expected and expected and row["counts"].get("sent", 0))
        log(
            f"suppressed {len(got):,} of {len(expected):,} injected bounces and complaints: "
            + ("nothing lost" if got == expected else f"lost {len(set(expected) - set(got))}")
        )
    except (Exception, KeyboardInterrupt) as exc:
        failure = exc
        result["ok"] = False
        if not broker.running():
            broker.start()
    finally:
        senders.stop()
        feedback.stop()
        if puller is not None:
            result["puller"] = puller.stop()
        if webhook is not None:
            result["webhook"] = webhook.stats() if webhook.proc.poll() is None else None
            webhook.stop()
        if sub_id is not None:
            events.unsubscribe(sub_id)
        if o.path == "sqs":
            _drop_queues(s, sink, delete=bool(result.get("ok")))
        events.clear_rates(s.marketing_configuration_set)
        result["seconds"] = round(time.monotonic() - began, 1)
    return finish_run(result, started, failure, log)


def _drop_queues(s: Settings, sink: SqsSinkAdmin, *, delete: bool) -> None:
    """The stand-in stops delivering to this run's queue; the queues go too when the run
    passed (a failed run's are kept for inspection)."""
    for sub in sink.state()["subscriptions"]:
        if str(sub["queue_url"]).endswith("/" + s.sqs_queue):
            sink.unsubscribe(sub["id"])
    if delete:
        client = boto3_sqs(s)
        for name in (s.sqs_queue, f"{s.sqs_queue}-dlq", f"{s.sqs_queue}-sns-dlq"):
            with contextlib.suppress(client.exceptions.QueueDoesNotExist):
                client.delete_queue(QueueUrl=client.get_queue_url(QueueName=name)["QueueUrl"])


def _replace_dead(pool: WorkerPool) -> int:
    """A worker that died while the broker was down is restarted, as a supervisor would."""
    dead = [p for p in pool.procs if p.poll() is not None]
    for proc in dead:
        pool.procs.remove(proc)
        pool.spawn()
    return len(dead)
