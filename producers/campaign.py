"""Campaign start: preflight, snapshot (one INSERT…SELECT), then produce every pending
recipient in Avro doorbells keyed by user_id (blocks of recipients sharing a partition:
producers.doorbells).

Starting twice produces nothing new: the snapshot only runs from `draft` (a conditional
UPDATE), and producing again is only done while `produced_at` is still NULL (a crash between
snapshot and the end of produce), where duplicates are harmless (claims are conditional).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import KafkaException, Producer
from psycopg import sql

from flashsend.deliverability import check_separation
from flashsend.errors import Conflict, FlashsendError, NotFound, UsageError
from flashsend.settings import Settings
from producers.corrections import check_correction_source
from producers.doorbells import DoorbellProducer
from producers.send_quota import DailyQuota, SpreadTarget, check_snapshot, read_daily_quota
from producers.send_schedule import NO_PLAN, SnapshotPlan, plan_snapshot, record_plan
from producers.sms_campaign import sync_opt_outs
from producers.topics import Replication, ensure_topics
from schemas import serde
from schemas.doorbell import DOORBELL_BATCH_RECORDS, DoorbellWriter
from sinks import recipient_partitions as partitions
from sinks.audit_store import Actor, record
from sinks.queries import query
from sinks.schedule_store import ScheduleStore
from sinks.seed_store import SeedPlan, SeedStore
from sinks.ses import SesCallFailed, SesSender, make_client
from sinks.sms import SmsCallFailed
from sinks.variant_store import VariantStore
from streams.rules.ab_test import bounds as ab_bounds
from streams.rules.push_message import MAX_DEVICES

Progress = Callable[[int, int], None]
PAGE = 50_000


class PreflightFailed(FlashsendError):
    """The campaign cannot start."""


@dataclass(frozen=True)
class StartResult:
    campaign_id: int
    recipients: int
    pending: int
    produced: int
    snapshot_s: float
    produce_s: float
    already_started: bool


def preflight(
    settings: Settings,
    template: str,
    rate: float,
    committed: float = 0.0,
    variant_templates: tuple[str, ...] = (),
) -> float:
    """Refuse before anything is written: the template must exist in SES and the rate must fit
    the account's MaxSendRate minus the reserve kept for transactional mail, minus `committed`
    (the limits of the other live campaigns: two campaigns at the full budget would eat the
    reserve). Returns the rate to use: an unlimited campaign (0) is capped at what is left
    when the account has a limit."""
    try:  # deliverability: marketing and transactional never share a config set
        check_separation(settings)
    except FlashsendError as exc:
        raise PreflightFailed(str(exc)) from exc
    ses = SesSender(make_client(settings, timeout=10))
    try:
        for name in dict.fromkeys((template, *variant_templates)):
            if not ses.template_exists(name):
                raise PreflightFailed(
                    f"SES template {name!r} does not exist: create it first "
                    f"(flashsend template put {name} …)"
                )
        quota = ses.get_send_quota()
    except SesCallFailed as exc:
        raise PreflightFailed(f"SES preflight failed: {exc}") from exc
    max_rate = quota.get("MaxSendRate", 0.0)
    reserve = settings.transactional_reserve
    if max_rate <= 0:
        return rate
    budget = max_rate - reserve - committed
    if budget <= 0 and committed > 0:
        raise PreflightFailed(
            f"the SES account's MaxSendRate {max_rate:g}/s minus the {reserve:g}/s reserved for "
            f"transactional mail is taken by other live campaigns ({committed:g}/s): wait for "
            "them, or lower their rate"
        )
    if budget <= 0:
        raise PreflightFailed(
            f"the SES account's MaxSendRate {max_rate:g}/s leaves nothing after the {reserve:g}/s "
            "reserved for transactional mail (FLASHSEND_TRANSACTIONAL_RESERVE)"
        )
    if rate <= 0:
        return budget
    if rate > budget:
        raise PreflightFailed(
            f"rate {rate:g}/s exceeds the SES account's MaxSendRate {max_rate:g}/s minus the "
            f"{reserve:g}/s reserved for transactional mail"
            + (f" and the {committed:g}/s of other live campaigns" if committed else "")
            + f": use --rate {budget:g} or less"
        )
    return rate


def _daily_quota(settings: Settings) -> DailyQuota:
    try:
        return read_daily_quota(SesSender(make_client(settings, timeout=10)))
    except SesCallFailed as exc:
        raise PreflightFailed(f"SES preflight failed: {exc}") from exc


def check_spreadable(
    conn: psycopg.Connection, campaign_id: int, ignore_quota: bool, has_seeds: bool
) -> None:
    """`--spread-over-quota` holds rows in day slots, which are seq ranges: rows held for
    another reason (an A/B holdout, a schedule's slots, a seed hold) would be released with
    them, so it takes a plain campaign."""
    if ignore_quota:
        raise UsageError("--spread-over-quota plans by the quota; it cannot go with --ignore-quota")
    other = (
        "an A/B test"
        if VariantStore(conn).state(campaign_id) is not None
        else "scheduled (--local-window/--waves)"
        if ScheduleStore(conn).stored(campaign_id) is not None
        else "given a seed list"
        if has_seeds
        else None
    )
    if other is not None:
        raise UsageError(
            f"campaign {campaign_id} is {other}: its held rows would be released with a day "
            "of the quota plan, so --spread-over-quota takes a plain campaign"
        )


# The snapshot statement of each channel (email: snapshot_recipients).
SNAPSHOT_STATEMENT = {"sms": "snapshot_sms_recipients", "push": "snapshot_push_recipients"}


def snapshot(
    conn: psycopg.Connection,
    campaign_id: int,
    audience: str,
    plan: SnapshotPlan | None = None,
    quota: DailyQuota | None = None,
    seeds: SeedPlan | None = None,
    spread_rate: float | None = None,
    actor: Actor | None = None,
) -> int:
    """Snapshot the audience into campaign_recipients in one transaction; returns the
    audience's row count (a seed list's rows come after it and are not counted).
    With a scheduled `plan`, rows not yet due are held in slots (producers.send_schedule).

    The transaction begins by moving the campaign out of `draft` (a conditional UPDATE): that
    row lock makes a concurrent or repeated start find nothing to do, and a snapshot that
    fails leaves the campaign in `draft`, ready to start again. With `quota`, rows that do
    not fit the account's 24-hour quota make it fail that way (QuotaExceeded), unless
    `spread_rate` (the campaign's rate) is given: then they are spread over days, one slot a
    day (producers.send_quota.QuotaPlan)."""
    args: dict[str, Any] = {"campaign_id": campaign_id}
    with conn.transaction():
        if conn.execute(query("begin_snapshot"), {"id": campaign_id}).fetchone() is None:
            raise Conflict(f"campaign {campaign_id} was started concurrently", state="snapshotting")
        ab = VariantStore(conn).state(campaign_id)
        variants = ab.variants if ab is not None else []
        names = [v.name for v in variants] or None
        plan = plan or SnapshotPlan({**NO_PLAN, "now": datetime.now(UTC)})
        snapshot_args = {
            **args,
            **plan.params,
            "variant_names": names,
            "variant_bounds": ab_bounds(variants) if names else None,
            "hold": seeds is not None,
        }
        # The row_number() sort of ~1M users spills to disk at the default 4 MB; so do the
        # index builds of the attach at the default 64 MB.
        conn.execute("SET LOCAL work_mem = '256MB'")
        conn.execute("SET LOCAL maintenance_work_mem = '256MB'")
        table = partitions.create_detached(conn, campaign_id)
        channel_row = conn.execute(query("campaign_channel"), {"id": campaign_id}).fetchone()
        channel = channel_row[0] if channel_row is not None else "email"
        statement = SNAPSHOT_STATEMENT.get(channel, "snapshot_recipients")
        snapshot_args["max_devices"] = MAX_DEVICES  # push: endpoints per row
        stmt = sql.SQL(query(statement)).format(
            audience=sql.SQL(audience), partition=table, order=plan.order
        )
        count = conn.execute(stmt, snapshot_args).rowcount
        record_plan(conn, plan, table, campaign_id)
        if seeds is not None:
            SeedStore(conn).add_to_snapshot(table, campaign_id, count, seeds)
        conn.execute(sql.SQL(query("count_snapshot")).format(partition=table), args)
        if quota is not None:
            now = plan.params["now"]
            spread = None if spread_rate is None else SpreadTarget(table, now, spread_rate)
            days = check_snapshot(conn, campaign_id, quota, spread=spread)
            if days is not None:
                schedule = ScheduleStore(conn)
                schedule.record_slots(table, campaign_id, now)
                schedule.note(
                    campaign_id, {"quota_plan": days.to_dict(), "planned_at": now.isoformat()}
                )
        # Statistics before any worker plans against the new rows (they become visible
        # together at commit). Without them, the planner took record_results through every
        # row of the campaign: 203 ms a call instead of 1.2 ms, for the first ~1,500 calls of
        # a 1M campaign (pg_stat_statements, docs/decisions.md). Only this campaign's rows
        # are sampled, 3,000 of them (statistics target 10): seq and user_id are unique and
        # status has two values, which that sample shows as well as the default 30,000
        # (0.01 s instead of 0.08-0.13 s for 860k rows). Autovacuum's later ANALYZE uses the
        # server's default.
        conn.execute("SET LOCAL default_statistics_target = 10")
        conn.execute(sql.SQL("ANALYZE {table}").format(table=table))
        partitions.attach(conn, campaign_id)
        conn.execute(query("finish_snapshot"), {"id": campaign_id, "recipients": count})
        record(
            conn,
            actor,
            "start",
            campaign_id,
            "draft",
            "sending",
            {"recipients": count, **({"seeds": len(seeds.emails)} if seeds else {})},
        )
    return count


def ensure_campaign_topics(settings: Settings) -> None:
    ensure_topics(
        settings.kafka_bootstrap,
        {settings.topic_recipients: settings.partitions, settings.topic_dlq: 1},
        replication=Replication.of(settings),
    )


def produce_pending(
    settings: Settings, conn: psycopg.Connection, campaign_id: int, progress: Progress | None = None
) -> int:
    """Produce a doorbell for every pending row of the campaign; returns how many."""
    ensure_campaign_topics(settings)
    return _produce_doorbells(settings, conn, campaign_id, progress)


def _produce_doorbells(
    settings: Settings, conn: psycopg.Connection, campaign_id: int, progress: Progress | None
) -> int:
    """`produce_pending` once the campaign's topics exist."""
    codec = serde.codec(settings, "campaign_recipient")
    producer = Producer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "batch.num.messages": DOORBELL_BATCH_RECORDS,
            "queue.buffering.max.messages": 100_000,
        }
    )
    total_row = conn.execute(query("pending_count"), {"campaign_id": campaign_id}).fetchone()
    total = int(total_row[0]) if total_row else 0
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    produced = 0
    doorbells = DoorbellProducer(
        producer,
        settings.topic_recipients,
        DoorbellWriter(codec, campaign_id, int(time.time() * 1000)),
        on_delivery,
    )
    after_seq = 0
    while True:
        # Keyset pages over the primary key: no long-running transaction, no server cursor.
        rows = conn.execute(
            query("pending_for_produce"),
            {"campaign_id": campaign_id, "after_seq": after_seq, "limit": PAGE},
        ).fetchall()
        if not rows:
            break
        after_seq = rows[-1][0]
        doorbells.add(rows)
        produced += len(rows)
        if progress:
            progress(produced, total)
    doorbells.flush()
    remaining = producer.flush(120)
    if progress:
        progress(produced, total)
    if remaining or failures:
        raise FlashsendError(
            f"{remaining} record(s) not delivered, {len(failures)} delivery error(s) "
            f"(first: {failures[:1]}); run `flashsend campaign start {campaign_id}` again — "
            "re-producing is safe"
        )
    # A scheduled campaign's start produces only the rows due then: their spread over the
    # partitions is not the campaign's, so its lanes split the rate evenly (weights NULL).
    scheduled = ScheduleStore(conn).stored(campaign_id) is not None
    weights = None if scheduled else doorbells.recipients
    conn.execute(query("mark_produced"), {"id": campaign_id, "weights": weights})
    return produced


def start_campaign(
    settings: Settings,
    campaign_id: int,
    *,
    progress: Progress | None = None,
    skip_preflight: bool = False,
    now: datetime | None = None,
    ignore_quota: bool = False,
    spread_over_quota: bool = False,
    seeds: SeedPlan | None = None,
    actor: Actor | None = None,
) -> StartResult:
    """`now` (default: the clock) is when a scheduled campaign's plan counts from. With
    `seeds`, the seed list gets the mail first and the audience is held for `seeds.hold_s`
    (streams/rules/seed_list.py); a started campaign ignores them. With `spread_over_quota`, a
    campaign that does not fit the 24-hour quota is planned over days instead of refused."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(query("get_campaign"), {"id": campaign_id}).fetchone()
        if row is None:
            raise NotFound(f"campaign {campaign_id} does not exist")
        template, rate, audience, status, produced_at = row[2], row[5], row[6], row[7], row[13]
        channel = row[16]
        if status != "draft" and not (status in ("sending", "paused") and produced_at is None):
            count = int(row[9] or 0)
            return StartResult(campaign_id, count, 0, 0, 0.0, 0.0, already_started=True)
        # Kafka and the contract first: a start they refuse leaves a draft a draft.
        ensure_campaign_topics(settings)
        serde.check_registered(settings, ("campaign_recipient",))
        if status == "draft":
            quota = None
            if channel == "sms":
                try:
                    sync_opt_outs(settings, conn)
                except SmsCallFailed as exc:
                    raise PreflightFailed(f"the SMS opt-out list cannot be read: {exc}") from exc
            elif channel == "push":
                pass  # no SES template to check; devices and opt-outs are read at the call
            elif not skip_preflight:
                committed_row = conn.execute(
                    query("committed_marketing_rate"), {"id": campaign_id}
                ).fetchone()
                committed = float(committed_row[0]) if committed_row else 0.0
                ab = VariantStore(conn).state(campaign_id)
                effective = preflight(
                    settings,
                    template,
                    float(rate),
                    committed,
                    tuple(v.template for v in ab.variants) if ab else (),
                )
                if effective != float(rate):
                    conn.execute(
                        "UPDATE campaigns SET rate_limit = %s WHERE id = %s",
                        (effective, campaign_id),
                    )
                if not ignore_quota:
                    quota = _daily_quota(settings)
            check_correction_source(conn, campaign_id)
            if channel != "email" and (seeds is not None or spread_over_quota):
                raise UsageError(
                    "a seed list and --spread-over-quota are for email campaigns (the SES "
                    f"24-hour quota); an {channel.upper()} campaign takes neither"
                )
            if seeds is not None and ScheduleStore(conn).stored(campaign_id) is not None:
                raise UsageError(
                    f"campaign {campaign_id} is scheduled (--local-window/--waves): its rows "
                    "already wait for their time, so it takes no seed hold; send the seed "
                    "list as a campaign of its own first"
                )
            spread_rate = None
            if spread_over_quota:
                check_spreadable(conn, campaign_id, ignore_quota, seeds is not None)
                rate_row = conn.execute(query("get_campaign"), {"id": campaign_id}).fetchone()
                spread_rate = float(rate_row[5]) if rate_row else 0.0
            t0 = time.monotonic()
            plan = plan_snapshot(settings, conn, campaign_id, audience, now or datetime.now(UTC))
            recipients = snapshot(
                conn, campaign_id, audience, plan, quota, seeds, spread_rate, actor
            )
            snapshot_s = time.monotonic() - t0
            already = False
        else:  # started, not yet produced in full: resume
            recipients = int(row[9] or 0)
            snapshot_s = 0.0
            already = True
        t1 = time.monotonic()
        try:
            produced = _produce_doorbells(settings, conn, campaign_id, progress)
        except KafkaException as exc:
            raise FlashsendError(f"producing failed: {exc}; start again to resume") from exc
        SeedStore(conn).start_hold(campaign_id)
        pending_row = conn.execute(query("pending_count"), {"campaign_id": campaign_id}).fetchone()
        return StartResult(
            campaign_id,
            recipients,
            int(pending_row[0]) if pending_row else 0,
            produced,
            snapshot_s,
            time.monotonic() - t1,
            already,
        )
