"""Settings, read once from the environment (prefix ``FLASHSEND_``) and passed down frozen.

Nothing else in the code base reads ``os.environ``. Every endpoint may point at an external
service instead of the local stack: set ``FLASHSEND_KAFKA_BOOTSTRAP``, ``FLASHSEND_PG_DSN``,
``FLASHSEND_SES_ENDPOINT`` (empty string = real Amazon SES) and list in
``FLASHSEND_LOCAL_SERVICES`` only the services ``flashsend up`` should start itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

from psycopg.conninfo import make_conninfo
from pydantic import SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from flashsend.errors import UsageError

ENV_PREFIX = "FLASHSEND_"
# Deliverability: a well-known key, refused when sending through real Amazon SES.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
LOCAL_UNSUBSCRIBE_KEYS = "local:Zmxhc2hzZW5kLWxvY2FsLW9ubHktdW5zdWJzY3JpYmU="
LOCAL_FIREHOSE_ACCESS_KEY = "flashsend-local-only-firehose-access-key"

# A list setting: `a,b` as people type it, or a JSON array (what settings_env writes).
Names = Annotated[tuple[str, ...], NoDecode]


class SettingsInvalid(UsageError):
    """A FLASHSEND_* setting does not parse or validate."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    state_dir: Path = Path(".flashsend")
    # Downloads (Kafka jars) shared by every state dir, so test stacks reuse them.
    cache_dir: Path = Path(".flashsend/cache")
    local_services: Names = ("kafka", "postgres", "ses", "registry", "webhook", "api")

    # Kafka (local broker: ports below; external: set kafka_bootstrap).
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    kafka_bootstrap: str = ""  # empty: the local broker on kafka_port
    kafka_heap_mb: int = 512
    # Nodes of the local KRaft cluster (each broker and controller). Node i > 0 listens on
    # kafka_port + 10 i (controller: kafka_controller_port + 10 i).
    kafka_brokers: int = 1
    partitions: int = 12
    # Replicas per partition of the topics we create, and how many must acknowledge a write
    # (producers use acks=all). Checked against the broker count at start. Production: 3 and 2.
    # Left unset on a local cluster of N brokers: min(3, N), and 2 when that is 3.
    topic_replication_factor: int = 1
    topic_min_insync_replicas: int = 1

    # PostgreSQL (local: embedded server on pg_port; external: set pg_dsn).
    pg_port: int = 15432
    pg_database: str = "flashsend"
    pg_dsn: str = ""  # empty: the local server on pg_port

    # SES: the local stand-in by default; an empty endpoint means real Amazon SES.
    ses_port: int = 14566
    ses_endpoint: str | None = None  # None: local stand-in; "": real Amazon SES
    ses_region: str = "us-east-1"
    ses_access_key_id: str = "flashsend-local"
    ses_secret_access_key: SecretStr = SecretStr("flashsend-local")
    ses_max_send_rate: int = 20000
    ses_latency_ms: int = 0
    ses_resume_events: bool = False  # the stand-in keeps undelivered SNS events across restarts

    # Empty: the local registry (Confluent API of Apicurio) when "registry" is a local service,
    # else confluent-kafka's in-process mock://. Set it to use an external registry.
    schema_registry_url: str = ""

    # Topics and consumer groups (tests give each test its own).
    topic_recipients: str = "campaign.recipients"
    topic_mail_events: str = "mail.events"
    topic_order_events: str = "order.events"
    topic_dlq: str = "flashsend.dlq"
    group_sender: str = "flashsend-sender"
    app_id: str = "flashsend"

    # Campaign defaults.
    marketing_configuration_set: str = "marketing"
    transactional_configuration_set: str = "transactional"
    from_address: str = "Flash Sale <sale@news.flashsend.test>"
    default_rate: float = 600.0
    # Recipients/s of the SES account's MaxSendRate kept free for transactional mail.
    transactional_reserve: float = 50.0
    audience_condition: str = "u.status = 'active' AND u.marketing_opt_in"
    # Scheduled sending: the zone of a user without users.timezone (or with an unknown one)
    # for --local-window, and how recent an open or click puts a user in --waves' `recent`.
    default_timezone: str = "UTC"
    recent_engagement_days: float = 30.0

    # SMS campaigns (AWS End User Messaging SMS, `pinpoint-sms-voice-v2`). Locally the SES
    # stand-in speaks that protocol too, on the same endpoint; against AWS (ses_endpoint "")
    # boto3 finds the service's own endpoint.
    sms_origination_identity: str = "+12065550100"
    sms_configuration_set: str = "marketing-sms"
    sms_opt_out_list: str = "Default"
    # Promotional texts go only within these hours of the recipient's local day (their
    # users.timezone, else default_timezone): quiet-hours rules such as the US TCPA's
    # 8 a.m.-9 p.m. An SMS campaign takes them as its local window, and a row whose window has
    # ended before its turn is skipped, `quiet_hours`, not sent late. Empty: no quiet hours.
    sms_send_hours: str = "08:00-21:00"
    # SendTextMessage calls in flight per worker: one message per call, so a lane's call of
    # up to 50 rows goes out as concurrent calls on a thread pool of this size.
    sms_inflight_calls: int = 16
    # Rows per lane call of an SMS campaign (1..50): they enter the call together, so a worker
    # killed mid-call leaves at most this many unknown per lane; several lanes' calls keep
    # sms_inflight_calls busy.
    sms_call_size: int = 10
    sms_timeout_s: float = 10.0

    # Push campaigns (SNS Publish to platform endpoints; locally the stand-in speaks SNS on the
    # same endpoint). One platform application per platform: these names, created when
    # missing (`flashsend push setup`); delivery failures go to the first SNS topic, which the
    # webhook subscribes. Publishes in flight per worker, rows per lane call, as for SMS.
    push_application_fcm: str = "flashsend-fcm"
    push_application_apns: str = "flashsend-apns"
    push_inflight_calls: int = 16
    push_call_size: int = 10
    push_timeout_s: float = 10.0
    # Quiet hours of push notifications, as sms_send_hours for texts. Empty: none.
    push_send_hours: str = "08:00-21:00"

    # Sender tuning.
    batch_size: int = 50
    inflight_calls: int = 12
    # How far over its campaign limit one sliding second at SES may go, only to make up for
    # SES's call latency (a lane's window counts a call from its request to a second after
    # its answer, so without it a lane sends limit / (1 + latency)). 0: a strict bound.
    window_slack: float = 0.02
    ses_timeout_s: float = 10.0
    lease_s: float = 120.0  # > the longest possible call with its retries
    reconcile_interval_s: float = 5.0
    group_session_timeout_s: float = 6.0  # the broker's minimum (group.min.session.timeout.ms)
    worker_shutdown_grace_s: float = 20.0  # hard exit this long after SIGTERM
    worker_exit_with_parent: bool = False  # set for workers spawned by demo/chaos/bench/tests
    group_rebalance_timeout_s: float = 20.0
    # Static group membership (Kafka KIP-345). A supervised worker restarted under the same
    # instance name takes its partitions back without a rebalance, instead of the group
    # waiting a session timeout for the dead member and then rebalancing everyone. Empty:
    # dynamic membership. Set per slot by WorkerPool(static=True) (chaos), or by hand.
    worker_instance: str = ""

    # Transactional mail — docs/transactional.md explains each knob.
    orders_database: str = "flashsend_orders"  # the demo order service's own database
    orders_pg_dsn: str = ""  # empty: orders_database on the same server as pg_dsn
    order_events_partitions: int = 3
    order_events_retention_s: float = 7 * 86400.0  # retention.ms of order.events
    group_mail: str = "flashsend-mail"
    group_orders: str = "flashsend-orders"
    mail_app_id: str = "flashsend-mail"
    mail_from_address: str = "Shop <orders@shop.flashsend.test>"
    mail_rate: float = 40.0  # sends/s per mail worker; must fit in transactional_reserve
    mail_concurrency: int = 8  # SES calls in flight per mail worker
    mail_ses_timeout_s: float = 5.0  # read timeout of one SendEmail (connect: min(this, 2))
    mail_lease_s: float = 30.0  # > concurrency / rate + 2 x the worst send time (validated)
    mail_max_attempts: int = 5  # explicit failures before a mail is `failed`
    mail_retry_base_s: float = 1.0
    mail_retry_cap_s: float = 60.0
    mail_at_most_once_templates: Names = ("payment_notice",)
    # Legally required mail (e.g. a data-breach notice) still goes to an address suppressed
    # for a hard bounce or a complaint; an operator's manual block still stops it.
    mail_suppression_exempt_templates: Names = ()
    mail_event_max_age_s: float = 86400.0  # older order events are ignored (replay trap)
    mail_retention_s: float = 8 * 86400.0  # dedupe keys kept at least the topic's retention
    mail_poll_s: float = 1.0  # sweep: lost doorbells, due send_after, expired leases
    relay_batch: int = 100
    relay_poll_s: float = 0.5
    relay_publish_timeout_s: float = 30.0  # > p99 broker ack latency (seed trap 10)
    relay_max_failures: int = 10  # message-specific publish failures before `dead`
    relay_backoff_cap_s: float = 30.0

    # Operations — docs/operations.md: schema registry, replay, metrics, logs.
    registry_port: int = 18081  # local Apicurio Registry (loopback only)
    registry_heap_mb: int = 384
    registry_database: str = "flashsend_registry"  # Apicurio's storage on the stack's PostgreSQL
    registry_java: str = ""  # a java >= 21 for the registry; empty: newest found on this machine
    # Per-subject level set by `schemas register` and used by the offline check. FULL, not only
    # BACKWARD: in a rolling deploy old consumers read new records too (global rule: BACKWARD).
    schema_compatibility: str = "FULL"
    # May producers and workers register a missing schema at start (its subject created at
    # schema_compatibility)? Empty: only on the local stack (mock:// or a loopback registry);
    # elsewhere `flashsend schemas register` is a deploy step and a missing schema stops them.
    schema_auto_register: bool | None = None
    metrics_port: int = 0  # /metrics of workers and relay: 0 = off, -1 = any free port (logged)
    metrics_host: str = "127.0.0.1"
    log_format: str = "text"  # text | json (one JSON object per line, message fields as keys)
    operator: str = ""  # who runs replay/dlq commands (audit); empty: the login name

    # Deliverability — docs/deliverability.md explains each knob.
    webhook_port: int = 14567
    # Processes sharing webhook_port (SO_REUSEPORT), ~1 core each; 0: half the CPUs, at least
    # one (the broker, PostgreSQL and the workers share the machine).
    webhook_processes: int = 0
    webhook_public_url: str = ""  # base of List-Unsubscribe URLs; empty: http://127.0.0.1:PORT
    sns_topic_arns: Names = ("arn:aws:sns:us-east-1:000000000000:flashsend-ses-events",)
    sns_cert_authority: str = ""  # host:port of a local signer; empty: see feedback_config.py
    unsubscribe_keys: SecretStr = SecretStr(LOCAL_UNSUBSCRIBE_KEYS)  # "kid:base64,…", 1st current
    feedback_app_id: str = ""  # Faust app id = consumer group; empty: "{app_id}-feedback"
    feedback_complaint_threshold: float = 0.001  # pause when complaints/sent exceeds this …
    feedback_bounce_threshold: float = 0.05  # … or hard bounces/sent exceeds this …
    feedback_min_sample: int = 10_000  # … once this many messages were sent
    feedback_dedupe_retention_s: float = 8 * 86400.0  # > mail.events retention (replays)
    # Campaign lanes start no call while the feedback agent's oldest unapplied event has waited
    # longer than this (s), and go on once it is back under half of it; 0: never hold. The lag
    # overshoots it while the agent drains what was sent before the hold (to ~2.7x here), and
    # 1.5 keeps an event's p99 under 5 s at full speed on two cores (docs/performance.md).
    feedback_max_lag_s: float = 1.5
    webhook_publish_timeout_s: float = 10.0  # broker ack wait before answering SNS 503
    # Keys a Firehose delivery stream may present at POST /firehose (comma-separated: more
    # than one while a key is rotated); empty: the route refuses every request. The default
    # is a well-known key for the local stack, refused when sending through real Amazon SES.
    firehose_access_keys: SecretStr = SecretStr(LOCAL_FIREHOSE_ACCESS_KEY)
    # SES event types the configuration sets' event destinations publish: what the feedback
    # agent and reconcile use. Add "Open" and "Click" for engagement (A/B winners need them).
    # No "Send": it doubles the events of every campaign and adds nothing the agent needs (the
    # pause's base is max(sent, delivered + bounced); a row in doubt is settled by its
    # Delivery, Bounce, Complaint, Reject or DeliveryDelay); add it to settle rows sooner.
    ses_event_types: Names = (
        "Delivery",
        "Bounce",
        "Complaint",
        "Reject",
        "DeliveryDelay",
        "Rendering Failure",
    )

    # The Campaign HTTP API (`flashsend api`; docs/api.md). Local: loopback only.
    api_port: int = 14568
    api_host: str = "127.0.0.1"
    api_requests_per_minute: float = 3000.0  # per API key; 0 = no budget
    api_requests_burst: float = 0.0  # requests a key may send at once; 0: a tenth of a minute's
    api_pool_size: int = 8  # PostgreSQL connections of one API process (reads, keys)
    api_events_interval_s: float = 0.5  # seconds between two frames of a campaign's event stream
    console_session_hours: float = 12.0  # a console sign-in lasts this long (absolute)

    # How SES events reach mail.events (docs/deliverability.md compares the paths): firehose
    # (SES → Firehose → the webhook's /firehose, batches of up to 500 events), webhook (SES →
    # SNS → /sns, one signed POST per event) or sqs (SES → SNS → SQS → `flashsend events pull`).
    # What `flashsend aws plan` sets up, and how `flashsend up` routes the stand-in's events.
    # Firehose by default: every event arrives, at about a third of the CPU per event.
    events_ingest: Literal["firehose", "webhook", "sqs"] = "firehose"
    sqs_port: int = 19324  # local ElasticMQ (loopback only), when "sqs" is a local service
    sqs_endpoint: str | None = None  # None: local ElasticMQ; "": real Amazon SQS
    # Every queued message lives in its heap: 100,000 SES events need more than 128 MB; 512
    # holds 200,000.
    sqs_heap_mb: int = 512
    sqs_persist: bool = True  # ElasticMQ keeps messages on disk (survive down/up); False: memory
    sqs_queue: str = "flashsend-ses-events"  # its dead-letter queue: "<name>-dlq"
    sqs_max_receive_count: int = 10  # receives before SQS moves a message to the DLQ
    sqs_retention_s: int = 14 * 86400  # SQS's maximum
    events_pullers: int = 4  # concurrent ReceiveMessage long polls of `events pull`
    events_wait_s: int = 20  # long-poll wait of one ReceiveMessage (SQS's maximum)
    events_visibility_s: int = 60  # a message not deleted by then is delivered again
    aws_events_destination: str = "flashsend-events"  # the configuration sets' event destination
    # SES events through Amazon Data Firehose (SES → delivery stream → POST /firehose of the
    # webhook, FLASHSEND_FIREHOSE_ACCESS_KEYS' first key) — docs/deliverability.md §15.
    firehose_stream: str = "flashsend-ses-events"  # the delivery stream `aws apply` makes
    # IAM roles (name in the sending account, or ARN) that `aws apply` names but does not make:
    # the one SES assumes to put records into the stream, the one the stream assumes to write
    # what it could not deliver to the backup bucket.
    firehose_ses_role: str = "flashsend-ses-to-firehose"
    firehose_backup_role: str = "flashsend-firehose-backup"
    firehose_backup_bucket: str = ""  # S3 bucket of undelivered records; empty: <stream>-<account>
    # Buffering: a request leaves when 1 MiB of events is buffered or 1 s after the oldest
    # (a complaint must pause a campaign within seconds; Firehose bills bytes, not requests).
    firehose_buffer_mb: int = 1
    firehose_buffer_s: int = 1

    @field_validator("*", mode="before")
    @classmethod
    def _split_names(cls, value: object, info: Any) -> object:
        field = cls.model_fields.get(info.field_name)
        if field is None or field.annotation != tuple[str, ...] or not isinstance(value, str):
            return value
        return split_names(value)

    @model_validator(mode="after")
    def _fill_local_endpoints(self) -> Settings:
        # Frozen model: defaults that depend on other fields are filled once, here.
        if self.kafka_brokers < 1:
            raise ValueError(f"FLASHSEND_KAFKA_BROKERS must be >= 1, got {self.kafka_brokers}")
        if not 1 <= self.push_call_size <= 50:
            raise ValueError(f"FLASHSEND_PUSH_CALL_SIZE must be 1..50, got {self.push_call_size}")
        if not 1 <= self.sms_call_size <= 50:
            raise ValueError(f"FLASHSEND_SMS_CALL_SIZE must be 1..50, got {self.sms_call_size}")
        if not 0 <= self.window_slack <= 0.1:
            raise ValueError(
                "FLASHSEND_WINDOW_SLACK must be 0..0.1 (0: a strict bound), "
                f"got {self.window_slack}"
            )
        if self.feedback_max_lag_s < 0:
            raise ValueError(
                f"FLASHSEND_FEEDBACK_MAX_LAG_S must be >= 0 (0: never hold), "
                f"got {self.feedback_max_lag_s}"
            )
        if not self.kafka_bootstrap:
            nodes = [self.kafka_node_ports(i)[0] for i in range(self.kafka_brokers)]
            bootstrap = ",".join(f"127.0.0.1:{port}" for port in nodes)
            object.__setattr__(self, "kafka_bootstrap", bootstrap)
            if "topic_replication_factor" not in self.model_fields_set:
                object.__setattr__(self, "topic_replication_factor", min(3, self.kafka_brokers))
            if "topic_min_insync_replicas" not in self.model_fields_set:
                insync = 2 if self.topic_replication_factor >= 3 else 1
                object.__setattr__(self, "topic_min_insync_replicas", insync)
        if not self.pg_dsn:
            dsn = f"postgresql://postgres@127.0.0.1:{self.pg_port}/{self.pg_database}"
            object.__setattr__(self, "pg_dsn", dsn)
        if self.ses_endpoint is None:
            object.__setattr__(self, "ses_endpoint", f"http://127.0.0.1:{self.ses_port}")
        if self.sqs_endpoint is None:
            object.__setattr__(self, "sqs_endpoint", f"http://127.0.0.1:{self.sqs_port}")
        if not self.schema_registry_url:  # operations
            url = "mock://flashsend"
            if "registry" in self.local_services:
                url = f"http://127.0.0.1:{self.registry_port}/apis/ccompat/v7"
            object.__setattr__(self, "schema_registry_url", url)
        if self.schema_auto_register is None:
            local = urlsplit(self.schema_registry_url)
            on_stack = local.scheme == "mock" or local.hostname in LOOPBACK
            object.__setattr__(self, "schema_auto_register", on_stack)
        if not self.orders_pg_dsn:  # transactional mail
            dsn = make_conninfo(self.pg_dsn, dbname=self.orders_database)
            object.__setattr__(self, "orders_pg_dsn", dsn)
        object.__setattr__(self, "state_dir", self.state_dir.resolve())
        object.__setattr__(self, "cache_dir", self.cache_dir.resolve())
        return self

    def kafka_node_ports(self, node: int) -> tuple[int, int]:
        """(broker, controller) ports of local Kafka node `node` (0-based)."""
        return self.kafka_port + 10 * node, self.kafka_controller_port + 10 * node

    def pg_dsn_for(self, database: str | None = None) -> str:
        """The DSN of another database on the same server (tests, the order service)."""
        if database is None:
            return self.pg_dsn
        return make_conninfo(self.pg_dsn, dbname=database)

    @property
    def ses_endpoint_url(self) -> str | None:
        """endpoint_url for boto3, or None for real Amazon SES."""
        return self.ses_endpoint or None

    @property
    def sqs_endpoint_url(self) -> str | None:
        """endpoint_url for boto3, or None for real Amazon SQS."""
        return self.sqs_endpoint or None


def split_names(value: str) -> tuple[str, ...]:
    """A list setting's text: a JSON array, or names separated by commas."""
    text = value.strip()
    if text.startswith("["):
        items = json.loads(text)
        if not isinstance(items, list):
            raise ValueError("a JSON list was expected")
        return tuple(str(item) for item in items)
    return tuple(part.strip() for part in text.split(",") if part.strip())


def load_settings(**overrides: object) -> Settings:
    """The one place settings are read from the environment. A setting that does not parse
    or validate is one line naming it and showing a valid value (SettingsInvalid)."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsInvalid(describe_invalid(exc)) from None
    except SettingsError as exc:
        raise SettingsInvalid(str(exc)) from None


def describe_invalid(exc: ValidationError) -> str:
    """`FLASHSEND_X: what is wrong, e.g. <a valid value>` for each failed setting, in one line."""
    parts = []
    for error in exc.errors(include_url=False):
        loc = error.get("loc") or ()
        name = str(loc[0]) if loc else ""
        field = Settings.model_fields.get(name)
        what = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if field is None:
            parts.append(what)
            continue
        got = error.get("input")
        shown = f" (got {got!r})" if isinstance(got, str | int | float) and got != "" else ""
        parts.append(f"{ENV_PREFIX}{name.upper()}: {what}{shown}, e.g. {example_value(field)}")
    return "; ".join(parts) or str(exc).splitlines()[0]


def example_value(field: FieldInfo) -> str:
    """A value the setting accepts, as it is written in the environment."""
    default = field.default
    if isinstance(default, SecretStr):
        default = default.get_secret_value()
    if isinstance(default, tuple):
        return ",".join(default) if default else "a,b"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, int | float | str | Path) and default != "":
        return str(default)
    annotation = str(field.annotation)
    if get_origin(field.annotation) is Literal:
        return str(get_args(field.annotation)[0])
    for kind, sample in (("bool", "true"), ("int", "1"), ("float", "1.5")):
        if kind in annotation:
            return sample
    return "text"


def settings_env(settings: Settings) -> dict[str, str]:
    """FLASHSEND_* variables that reproduce `settings` in a child process (workers)."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, tuple | list):
            import json

            value = json.dumps(list(value))
        env[f"{ENV_PREFIX}{name.upper()}"] = str(value)
    return env
