"""What production needs in AWS for the feedback loop, and the actions that get there (pure).

`desired(settings, path, account)` says what must exist; `infra/aws_apply.py` reads what does
exist into a `Current`; `plan(desired, current)` compares them and returns the calls that make
them equal, in dependency order. Nothing here talks to AWS, so every decision is unit-tested.

Both ingest paths share: the SES configuration sets (marketing and transactional), an event
destination on each with the event types the feedback loop reads (Open and Click off), and the
SNS topic the webhook trusts (`FLASHSEND_SNS_TOPIC_ARNS`, first entry), whose access policy
lets SES publish for those configuration sets only. Then:

- `sqs`: the events queue (14 days' retention, long polling, a redrive policy sending a
  message received `sqs_max_receive_count` times to `<queue>-dlq`), an access policy letting
  only the topic send to it, and a raw-delivery SQS subscription;
- `webhook`: an HTTPS subscription to the webhook with the delivery policy below (SNS retries
  for about an hour, the longest AWS allows) and a redrive policy: what SNS still could not
  deliver lands in `<queue>-sns-dlq` instead of being dropped.

Either way the subscription's own failures (SNS could not deliver at all) go to
`<queue>-sns-dlq`.

- `firehose`: no SNS, no queue: the event destination is the delivery stream
  `aws_firehose.py` describes (HTTP endpoint = the webhook's /firehose), which `apply` makes;
  the IAM roles and the S3 bucket it names are prerequisites `plan` describes and `apply`
  checks against AWS (`Current.missing`) but never makes. The account comes from the topic
  ARN (the sending account), as on the other paths.

With an SMS configuration set (`FLASHSEND_SMS_CONFIGURATION_SET`), against AWS only: that
configuration set (AWS End User Messaging SMS, `pinpoint-sms-voice-v2`) with an event
destination of the TEXT_* types the feedback loop reads to the same topic, the topic policy
letting End User Messaging publish, and two-way SMS of the origination number
(`FLASHSEND_SMS_ORIGINATION_IDENTITY`) to the same topic, so STOP replies reach the webhook.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.aws_firehose import (
    CurrentStream,
    FirehoseStream,
    create_params,
    default_bucket,
    describe_prerequisite,
    differences,
    prerequisites,
    role_arn,
    tag_params,
    update_params,
)
from streams.rules.resolution import OUTCOME_BY_EVENT

PATHS = ("sqs", "webhook", "firehose")
# The default event types of an event destination (FLASHSEND_SES_EVENT_TYPES sets them).
SES_EVENT_TYPES = (
    "SEND",
    "REJECT",
    "BOUNCE",
    "COMPLAINT",
    "DELIVERY",
    "DELIVERY_DELAY",
    "RENDERING_FAILURE",
)
# The same types in the stand-in's (SES event JSON's) spelling.
EVENT_TYPE_NAMES = {
    "SEND": "Send",
    "REJECT": "Reject",
    "BOUNCE": "Bounce",
    "COMPLAINT": "Complaint",
    "DELIVERY": "Delivery",
    "DELIVERY_DELAY": "DeliveryDelay",
    "RENDERING_FAILURE": "Rendering Failure",
    "OPEN": "Open",
    "CLICK": "Click",
    "SUBSCRIPTION": "Subscription",
}
# The SES stand-in's SQS path emits no engagement or subscription events (only its SNS path
# emits Open/Click): its SQS subscription leaves them out (AWS's event destination keeps them).
NOT_EMITTED_LOCALLY = frozenset({"OPEN", "CLICK", "SUBSCRIPTION"})
LOCAL_ACCOUNT = "000000000000"

# SNS HTTP/S limits (docs.aws.amazon.com/sns/latest/dg/sns-message-delivery-retries.html):
# numRetries <= 100, 1 <= minDelayTarget <= maxDelayTarget <= 3600, and the whole policy's
# retry time at most 3,600 s. This one: 2 retries 5 s apart, 10 growing exponentially from
# 5 s to 60 s, then 55 a minute apart: about 59 minutes (`retry_window_s`).
HTTP_DELIVERY_POLICY: dict[str, Any] = {
    "healthyRetryPolicy": {
        "minDelayTarget": 5,
        "maxDelayTarget": 60,
        "numRetries": 67,
        "numNoDelayRetries": 0,
        "numMinDelayRetries": 2,
        "numMaxDelayRetries": 55,
        "backoffFunction": "exponential",
    }
}
MAX_RETRY_WINDOW_S = 3600
# What the SMS event destination publishes: the TEXT_* types that settle a row (the feedback
# loop's streams.rules.resolution). Replies come through two-way SMS, not the destination.
SMS_EVENT_TYPES = tuple(t for t in OUTCOME_BY_EVENT if t.startswith("TEXT_"))
MAX_RETRIES = 100


def retry_window_s(policy: Mapping[str, Any]) -> float:
    """Seconds between the first attempt and the last retry of an HTTP/S delivery policy, as
    its four phases add up (exponential backoff phase: a geometric series from min to max)."""
    p = policy["healthyRetryPolicy"]
    low, high = float(p["minDelayTarget"]), float(p["maxDelayTarget"])
    no_delay = int(p.get("numNoDelayRetries", 0))
    at_min = int(p.get("numMinDelayRetries", 0))
    at_max = int(p.get("numMaxDelayRetries", 0))
    backoff = int(p["numRetries"]) - no_delay - at_min - at_max
    if backoff < 0:
        raise ValueError("numRetries is smaller than the retries of its phases")
    if backoff == 1:
        middle = low
    elif backoff > 1:
        ratio = (high / low) ** (1 / (backoff - 1))
        middle = low * (ratio**backoff - 1) / (ratio - 1) if ratio != 1 else low * backoff
    else:
        middle = 0.0
    return at_min * low + middle + at_max * high


def check_delivery_policy(policy: Mapping[str, Any]) -> None:
    """ValueError unless SNS would accept `policy` for an HTTP/S subscription."""
    p = policy["healthyRetryPolicy"]
    if not 0 <= int(p["numRetries"]) <= MAX_RETRIES:
        raise ValueError(f"numRetries must be 0..{MAX_RETRIES}")
    if not 1 <= int(p["minDelayTarget"]) <= int(p["maxDelayTarget"]) <= MAX_RETRY_WINDOW_S:
        raise ValueError("need 1 <= minDelayTarget <= maxDelayTarget <= 3600")
    if retry_window_s(policy) > MAX_RETRY_WINDOW_S:
        raise ValueError(f"the retries span more than {MAX_RETRY_WINDOW_S} s")


# ---- desired state --------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscription:
    protocol: str  # "sqs" | "https" | "http" (local only)
    endpoint: str  # queue ARN or URL
    attributes: dict[str, str]


@dataclass(frozen=True)
class Desired:
    path: str
    region: str
    account: str
    local: bool  # local endpoints: the stand-in for SES, a local SQS server, no SNS
    configuration_sets: tuple[str, ...]
    destination: str
    event_types: tuple[str, ...]
    topic_arn: str
    topic_attributes: dict[str, str]
    queues: dict[str, dict[str, str]]  # name -> attributes, in creation order
    subscription: Subscription
    # Attributes the local SQS server accepts and drops (never compared there).
    unkept_queue_attributes: frozenset[str] = frozenset()
    sms_configuration_set: str = ""  # "": no SMS set-up
    sms_number: str = ""  # the origination identity whose replies go to the topic
    firehose: FirehoseStream | None = None  # the firehose path's delivery stream

    @property
    def uses_sns(self) -> bool:
        """SNS parts are planned (against AWS): every path but firehose, which needs them
        only for the SMS configuration set's events."""
        return self.path != "firehose" or bool(self.sms_configuration_set and not self.local)

    def queue_arn(self, name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.account}:{name}"


def parse_topic_arn(arn: str) -> tuple[str, str, str]:
    """(region, account, name) of an SNS topic ARN; ValueError if it is not one."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sns" or not parts[5]:
        raise ValueError(f"not an SNS topic ARN: {arn!r}")
    if not (parts[4].isdigit() and len(parts[4]) == 12):
        raise ValueError(f"the account in {arn!r} is not a 12-digit AWS account id")
    return parts[3], parts[4], parts[5]


def _policy(statements: Sequence[dict[str, Any]]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)}, sort_keys=True)


def topic_policy(
    topic_arn: str, account: str, region: str, sets: Sequence[str], *, sms: bool = False
) -> str:
    """The account keeps its default rights; SES may publish for our configuration sets only;
    with `sms`, End User Messaging SMS may publish for this account (its event destinations
    and two-way messages)."""
    sms_statements: list[dict[str, Any]] = []
    if sms:
        sms_statements.append(
            {
                "Sid": "SmsEventsAndReplies",
                "Effect": "Allow",
                "Principal": {"Service": "sms-voice.amazonaws.com"},
                "Action": "SNS:Publish",
                "Resource": topic_arn,
                "Condition": {"StringEquals": {"AWS:SourceAccount": account}},
            }
        )
    return _policy(
        [
            {
                "Sid": "OwnerAccount",
                "Effect": "Allow",
                "Principal": {"AWS": "*"},
                "Action": [
                    "SNS:GetTopicAttributes",
                    "SNS:SetTopicAttributes",
                    "SNS:AddPermission",
                    "SNS:RemovePermission",
                    "SNS:DeleteTopic",
                    "SNS:Subscribe",
                    "SNS:ListSubscriptionsByTopic",
                    "SNS:Publish",
                ],
                "Resource": topic_arn,
                "Condition": {"StringEquals": {"AWS:SourceOwner": account}},
            },
            {
                "Sid": "SesEventPublishing",
                "Effect": "Allow",
                "Principal": {"Service": "ses.amazonaws.com"},
                "Action": "SNS:Publish",
                "Resource": topic_arn,
                "Condition": {
                    "StringEquals": {"AWS:SourceAccount": account},
                    "ArnLike": {
                        "AWS:SourceArn": [
                            f"arn:aws:ses:{region}:{account}:configuration-set/{name}"
                            for name in sets
                        ]
                    },
                },
            },
            *sms_statements,
        ]
    )


def queue_policy(queue_arn: str, topic_arn: str) -> str:
    """Only the topic may send: raw delivery carries no signature, so this is what makes a
    message in the queue an SES event of ours."""
    return _policy(
        [
            {
                "Sid": "OnlyOurTopic",
                "Effect": "Allow",
                "Principal": {"Service": "sns.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": topic_arn}},
            }
        ]
    )


@dataclass(frozen=True)
class Options:
    """What `desired` needs besides the path (from Settings, see `options_from`)."""

    topic_arn: str
    region: str
    configuration_sets: tuple[str, ...]
    destination: str
    queue: str
    retention_s: int
    visibility_s: int
    max_receive_count: int
    webhook_url: str
    local: bool
    event_types: tuple[str, ...] = SES_EVENT_TYPES  # SESv2 MatchingEventTypes names
    sms_configuration_set: str = ""  # "": the SMS channel is not set up
    sms_number: str = ""  # FLASHSEND_SMS_ORIGINATION_IDENTITY
    firehose_url: str = ""  # the webhook's public /firehose URL
    firehose_access_key: str = ""  # the first of FLASHSEND_FIREHOSE_ACCESS_KEYS
    firehose_stream: str = "flashsend-ses-events"
    firehose_ses_role: str = "flashsend-ses-to-firehose"  # name or ARN
    firehose_backup_role: str = "flashsend-firehose-backup"  # name or ARN
    firehose_backup_bucket: str = ""  # "": default_bucket(stream, account)
    firehose_buffer_mb: int = 1
    firehose_buffer_s: int = 1


def desired(options: Options, path: str) -> Desired:
    """ValueError names the first setting that cannot work."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}")
    o = options
    region, account, _name = parse_topic_arn(o.topic_arn)
    if region != o.region:
        raise ValueError(
            f"the SNS topic {o.topic_arn} is in {region}, SES in {o.region}: SES publishes "
            "events only to a topic in its own Region"
        )
    if not o.local and account == LOCAL_ACCOUNT:
        raise ValueError(
            f"FLASHSEND_SNS_TOPIC_ARNS names the local placeholder account {LOCAL_ACCOUNT}: "
            "set it to arn:aws:sns:<region>:<your account id>:<topic name>"
        )
    unknown = sorted(set(o.event_types) - set(EVENT_TYPE_NAMES))
    if unknown or not o.event_types:
        raise ValueError(f"event types {unknown or 'none'}: known {sorted(EVENT_TYPE_NAMES)}")
    if not o.configuration_sets:
        raise ValueError("no configuration set: set FLASHSEND_MARKETING_CONFIGURATION_SET")
    if path in ("webhook", "firehose") and not o.local and not o.webhook_url.startswith("https://"):
        raise ValueError(
            f"the {path} path needs the webhook's public https URL in "
            "FLASHSEND_WEBHOOK_PUBLIC_URL (SNS and Firehose deliver to https endpoints)"
        )
    firehose = _firehose_stream(o, region, account) if path == "firehose" else None
    check_delivery_policy(HTTP_DELIVERY_POLICY)
    arn = f"arn:aws:sqs:{region}:{account}:"
    sns_dlq = f"{o.queue}-sns-dlq"
    retention = str(o.retention_s)
    queues: dict[str, dict[str, str]] = {
        sns_dlq: {
            "MessageRetentionPeriod": retention,
            "Policy": queue_policy(arn + sns_dlq, o.topic_arn),
        }
    }
    redrive = json.dumps({"deadLetterTargetArn": arn + sns_dlq})
    if path == "sqs":
        dlq = f"{o.queue}-dlq"
        queues[dlq] = {"MessageRetentionPeriod": retention}
        queues[o.queue] = {
            "MessageRetentionPeriod": retention,
            "VisibilityTimeout": str(o.visibility_s),
            "ReceiveMessageWaitTimeSeconds": "20",
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": arn + dlq, "maxReceiveCount": o.max_receive_count}
            ),
            "Policy": queue_policy(arn + o.queue, o.topic_arn),
        }
        subscription = Subscription(
            "sqs", arn + o.queue, {"RawMessageDelivery": "true", "RedrivePolicy": redrive}
        )
    else:
        protocol = "https" if o.webhook_url.startswith("https://") else "http"
        subscription = Subscription(
            protocol,
            o.webhook_url,
            {"DeliveryPolicy": json.dumps(HTTP_DELIVERY_POLICY), "RedrivePolicy": redrive},
        )
    if path == "firehose" and not (o.sms_configuration_set and not o.local):
        queues = {}  # no SNS subscription, so no dead-letter queue for it
    return Desired(
        path=path,
        region=region,
        account=account,
        local=o.local,
        configuration_sets=o.configuration_sets,
        destination=o.destination,
        event_types=tuple(o.event_types),
        topic_arn=o.topic_arn,
        topic_attributes={
            "Policy": topic_policy(
                o.topic_arn,
                account,
                region,
                o.configuration_sets,
                sms=bool(o.sms_configuration_set),
            )
        },
        queues=queues,
        subscription=subscription,
        unkept_queue_attributes=(
            frozenset({"Policy", "MessageRetentionPeriod"}) if o.local and queues else frozenset()
        ),
        sms_configuration_set=o.sms_configuration_set,
        sms_number=o.sms_number,
        firehose=firehose,
    )


def _firehose_stream(o: Options, region: str, account: str) -> FirehoseStream:
    if not o.firehose_access_key:
        raise ValueError(
            "the firehose path needs FLASHSEND_FIREHOSE_ACCESS_KEYS: the stream presents its "
            "first key to the webhook's /firehose"
        )
    if not 1 <= o.firehose_buffer_mb <= 64 or not 0 <= o.firehose_buffer_s <= 900:
        raise ValueError(
            "FLASHSEND_FIREHOSE_BUFFER_MB must be 1..64 and FLASHSEND_FIREHOSE_BUFFER_S 0..900"
        )
    return FirehoseStream(
        name=o.firehose_stream,
        region=region,
        account=account,
        url=o.firehose_url,
        access_key=o.firehose_access_key,
        ses_role=role_arn(o.firehose_ses_role, account),
        backup_role=role_arn(o.firehose_backup_role, account),
        bucket=o.firehose_backup_bucket or default_bucket(o.firehose_stream, account),
        size_mb=o.firehose_buffer_mb,
        interval_s=o.firehose_buffer_s,
    )


# ---- current state --------------------------------------------------------------------------


@dataclass(frozen=True)
class CurrentSubscription:
    arn: str  # "PendingConfirmation" until the endpoint confirmed
    protocol: str
    endpoint: str
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Current:
    # configuration set -> its event destinations by name (None: the set does not exist)
    configuration_sets: dict[str, dict[str, dict[str, Any]] | None]
    # queue name -> (url, attributes) (None: no such queue)
    queues: dict[str, tuple[str, dict[str, str]] | None]
    topic: dict[str, str] | None = None  # attributes; None: no topic (or not read: local)
    subscriptions: tuple[CurrentSubscription, ...] = ()
    # Local only: the stand-in's SQS subscriptions (its stand-in for SNS → SQS).
    standin_subscriptions: tuple[dict[str, Any], ...] = ()
    # The SMS configuration set's event destinations by name (None: no such set).
    sms_destinations: dict[str, dict[str, Any]] | None = None
    # The origination phone number (DescribePhoneNumbers), None: not a phone number of the
    # account (a pool or a sender id: two-way is set on its numbers by hand).
    sms_phone_number: dict[str, Any] | None = None
    # The firehose path's delivery stream (None: none of that name).
    stream: CurrentStream | None = None
    # ARNs of the stream's IAM roles and bucket found missing in AWS; None: not checked (local).
    missing: tuple[str, ...] | None = None


# ---- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    service: str  # ses | sns | sqs | sms | standin
    operation: str  # the boto3 method (or the stand-in admin call)
    params: dict[str, Any]
    summary: str


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    up_to_date: tuple[str, ...]
    notes: tuple[str, ...]
    # What `apply` needs and does not make (IAM roles, S3 bucket) and found missing: it stops.
    missing: tuple[str, ...] = ()

    @property
    def changes(self) -> int:
        return len(self.actions)


def canonical(value: str) -> Any:
    """An attribute value as compared: JSON parsed with one-element lists unwrapped and
    numbers as text (AWS answers `"maxReceiveCount": 10` for `"10"`, and may store a
    single-element list as a scalar); other values as they are."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return _canon(parsed) if isinstance(parsed, dict | list) else value


def _canon(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        items = [_canon(v) for v in value]
        if len(items) == 1:
            return items[0]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return value


def _differs(
    wanted: Mapping[str, str], have: Mapping[str, str], skip: frozenset[str]
) -> dict[str, str]:
    return {
        k: v
        for k, v in wanted.items()
        if k not in skip and (k not in have or canonical(v) != canonical(have[k]))
    }


def plan(d: Desired, c: Current) -> Plan:
    actions: list[Action] = []
    ok: list[str] = []
    notes: list[str] = []

    # Queues first: the subscription and the redrive policies name them.
    for name, wanted in d.queues.items():
        found = c.queues.get(name)
        kept = {k: v for k, v in wanted.items() if k not in d.unkept_queue_attributes}
        if found is None:
            actions.append(
                Action(
                    "sqs",
                    "create_queue",
                    {"QueueName": name, "Attributes": kept},
                    f"create SQS queue {name} ({_describe_queue(wanted)})",
                )
            )
            continue
        url, have = found
        changed = _differs(wanted, have, d.unkept_queue_attributes)
        if changed:
            actions.append(
                Action(
                    "sqs",
                    "set_queue_attributes",
                    {"QueueUrl": url, "Attributes": changed},
                    f"set {', '.join(sorted(changed))} on SQS queue {name}",
                )
            )
        else:
            ok.append(f"SQS queue {name}")
    if d.unkept_queue_attributes:
        notes.append(
            "the local SQS server (ElasticMQ) accepts and drops "
            f"{', '.join(sorted(d.unkept_queue_attributes))}: not applied or compared locally "
            "(AWS keeps them: the unit tests check they are planned)"
        )

    if d.local and d.path != "firehose":
        notes.append(
            "SNS is not emulated locally: the topic, its policy and the subscription are planned "
            "only against AWS; locally the SES stand-in delivers to the "
            + (
                "queue itself (an SQS subscription with raw delivery)"
                if d.path == "sqs"
                else "webhook (`flashsend up` subscribes it)"
            )
        )
        if d.path == "sqs":
            actions.extend(_standin_subscription(d, c, ok))
    elif d.uses_sns:
        actions.extend(_topic(d, c, ok))
        actions.extend(_subscription(d, c, ok, notes))
    missing: tuple[str, ...] = ()
    if d.firehose is not None:  # the stream before the event destinations that name it
        actions.extend(_stream(d.firehose, c.stream, ok))
        missing = _prerequisites(d, c, notes)

    for name in d.configuration_sets:
        actions.extend(_configuration_set(d, name, c.configuration_sets.get(name), ok, notes))
    if d.sms_configuration_set:
        if d.local:
            notes.append(
                "SMS: locally `flashsend up` subscribes the webhook to the SMS configuration set "
                "and turns two-way SMS on at the stand-in; planned only against AWS"
            )
        else:
            actions.extend(_sms_configuration_set(d, c.sms_destinations, ok, notes))
            actions.extend(_sms_two_way(d, c.sms_phone_number, ok, notes))
    return Plan(tuple(actions), tuple(ok), tuple(notes), missing)


def _stream(s: FirehoseStream, current: CurrentStream | None, ok: list[str]) -> list[Action]:
    what = f"Firehose delivery stream {s.name}"
    how = (
        f"→ {s.url}, {s.size_mb} MiB / {s.interval_s} s buffers, gzip, retries for "
        f"{s.retry_s // 60} min, then s3://{s.bucket}"
    )
    if current is None:
        return [
            Action("firehose", "create_delivery_stream", create_params(s), f"create {what} {how}")
        ]
    changed = differences(s, current)
    if not changed:
        ok.append(what)
        return []
    actions = [
        Action(
            "firehose",
            "update_destination",
            update_params(s, current),
            f"update {what}: {', '.join(changed)}",
        )
    ]
    if "access key" in changed:
        actions.append(
            Action(
                "firehose",
                "tag_delivery_stream",
                tag_params(s),
                f"tag {what} with its new access key's SHA-256",
            )
        )
    return actions


def _prerequisites(d: Desired, c: Current, notes: list[str]) -> tuple[str, ...]:
    assert d.firehose is not None
    needed = prerequisites(d.firehose)
    if c.missing is None:
        notes.append(
            "IAM and S3 are not emulated locally: the stream and the event destinations name "
            "the roles and the bucket below, which are neither made nor checked here (against "
            "AWS `apply` checks they exist and stops if not; it never makes them)"
        )
    else:
        notes.append("`apply` does not make IAM roles or S3 buckets: they must exist")
    notes.extend(describe_prerequisite(p) for p in needed)
    return tuple(p["arn"] for p in needed if c.missing and p["arn"] in c.missing)


def _configuration_set_if_missing(
    service: str, name: str, destinations: dict[str, dict[str, Any]] | None
) -> list[Action]:
    """The action creating configuration set `name` of `service` when it does not exist
    (`destinations` None), else none."""
    if destinations is not None:
        return []
    label = "SMS" if service == "sms" else "SES"
    return [
        Action(
            service,
            "create_configuration_set",
            {"ConfigurationSetName": name},
            f"create {label} configuration set {name}",
        )
    ]


def _sms_configuration_set(
    d: Desired, destinations: dict[str, dict[str, Any]] | None, ok: list[str], notes: list[str]
) -> list[Action]:
    name = d.sms_configuration_set
    actions = _configuration_set_if_missing("sms", name, destinations)
    destinations = destinations or {}
    have = destinations.get(d.destination)
    what = f"event destination {d.destination} of SMS configuration set {name}"
    if have is None:
        actions.append(
            Action(
                "sms",
                "create_event_destination",
                {
                    "ConfigurationSetName": name,
                    "EventDestinationName": d.destination,
                    "MatchingEventTypes": list(SMS_EVENT_TYPES),
                    "SnsDestination": {"TopicArn": d.topic_arn},
                },
                f"add {what} (delivery and final failure TEXT_* events → SNS)",
            )
        )
    elif not (
        bool(have.get("Enabled"))
        and sorted(have.get("MatchingEventTypes") or []) == sorted(SMS_EVENT_TYPES)
        and (have.get("SnsDestination") or {}).get("TopicArn") == d.topic_arn
    ):
        actions.append(
            Action(
                "sms",
                "update_event_destination",
                {
                    "ConfigurationSetName": name,
                    "EventDestinationName": d.destination,
                    "Enabled": True,
                    "MatchingEventTypes": list(SMS_EVENT_TYPES),
                    "SnsDestination": {"TopicArn": d.topic_arn},
                },
                f"update {what} (delivery and final failure TEXT_* events → SNS)",
            )
        )
    else:
        ok.append(f"SMS configuration set {name} and its {what.split(' of ')[0]}")
    for other, dest in destinations.items():
        if other != d.destination:
            notes.append(f"event destination {other} of {name} is not ours: left as it is ({dest})")
    return actions


def _sms_two_way(
    d: Desired, number: dict[str, Any] | None, ok: list[str], notes: list[str]
) -> list[Action]:
    if number is None:
        notes.append(
            f"SMS two-way: {d.sms_number or 'the origination identity'} is not a phone number "
            f"of this account (a pool or a sender id?): turn two-way on for the numbers that "
            f"send with TwoWayChannelArn {d.topic_arn}, or STOP replies reach us only through "
            "the opt-out list at the next campaign start"
        )
        return []
    phone = str(number.get("PhoneNumber") or d.sms_number)
    if number.get("TwoWayEnabled") and number.get("TwoWayChannelArn") == d.topic_arn:
        ok.append(f"two-way SMS of {phone} to the SNS topic")
        return []
    return [
        Action(
            "sms",
            "update_phone_number",
            {
                "PhoneNumberId": str(number["PhoneNumberId"]),
                "TwoWayEnabled": True,
                "TwoWayChannelArn": d.topic_arn,
            },
            f"turn two-way SMS of {phone} on, to the SNS topic (STOP replies → the webhook)",
        )
    ]


def _describe_queue(attributes: Mapping[str, str]) -> str:
    parts = []
    if "MessageRetentionPeriod" in attributes:
        parts.append(f"retention {int(attributes['MessageRetentionPeriod']) // 86400} days")
    if "RedrivePolicy" in attributes:
        redrive = json.loads(attributes["RedrivePolicy"])
        target = redrive["deadLetterTargetArn"].rpartition(":")[2]
        parts.append(f"to {target} after {redrive['maxReceiveCount']} receives")
    if "Policy" in attributes:
        parts.append("only the SNS topic may send")
    return ", ".join(parts)


def _topic(d: Desired, c: Current, ok: list[str]) -> list[Action]:
    name = d.topic_arn.rpartition(":")[2]
    if c.topic is None:
        return [
            Action(
                "sns",
                "create_topic",
                {"Name": name, "Attributes": dict(d.topic_attributes)},
                f"create SNS topic {name} (SES may publish for {', '.join(d.configuration_sets)})",
            )
        ]
    changed = _differs(d.topic_attributes, c.topic, frozenset())
    if not changed:
        ok.append(f"SNS topic {name}")
    return [
        Action(
            "sns",
            "set_topic_attributes",
            {"TopicArn": d.topic_arn, "AttributeName": k, "AttributeValue": v},
            f"set {k} on SNS topic {name}",
        )
        for k, v in changed.items()
    ]


def _subscription(d: Desired, c: Current, ok: list[str], notes: list[str]) -> list[Action]:
    sub = d.subscription
    what = f"{sub.protocol} subscription {sub.endpoint}"
    found = [
        s for s in c.subscriptions if s.protocol == sub.protocol and s.endpoint == sub.endpoint
    ]
    confirmed = [s for s in found if s.arn.startswith("arn:")]
    if not confirmed:
        if found:
            notes.append(
                f"{what} is pending confirmation: is the webhook reachable there? subscribing "
                "again sends a new confirmation"
            )
        return [
            Action(
                "sns",
                "subscribe",
                {
                    "TopicArn": d.topic_arn,
                    "Protocol": sub.protocol,
                    "Endpoint": sub.endpoint,
                    "Attributes": dict(sub.attributes),
                    "ReturnSubscriptionArn": True,
                },
                f"subscribe {what} ({_describe_subscription(sub)})",
            )
        ]
    current = confirmed[0]
    changed = _differs(sub.attributes, current.attributes, frozenset())
    if not changed:
        ok.append(what)
    return [
        Action(
            "sns",
            "set_subscription_attributes",
            {"SubscriptionArn": current.arn, "AttributeName": k, "AttributeValue": v},
            f"set {k} on {what}",
        )
        for k, v in changed.items()
    ]


def _describe_subscription(sub: Subscription) -> str:
    if sub.attributes.get("RawMessageDelivery") == "true":
        return "raw message delivery, undeliverable to the SNS DLQ"
    if "DeliveryPolicy" in sub.attributes:
        window = retry_window_s(json.loads(sub.attributes["DeliveryPolicy"]))
        return f"retries for {window / 60:.0f} min, then to the SNS DLQ"
    return ""


def _standin_subscription(d: Desired, c: Current, ok: list[str]) -> list[Action]:
    queue_url_of = {name: found[0] for name, found in c.queues.items() if found is not None}
    queue = d.subscription.endpoint.rpartition(":")[2]
    types = sorted(EVENT_TYPE_NAMES[t] for t in d.event_types if t not in NOT_EMITTED_LOCALLY)
    for s in c.standin_subscriptions:
        if (
            s.get("topic_arn") == d.topic_arn
            and str(s.get("queue_url", "")).rstrip("/").endswith("/" + queue)
            and sorted(s.get("event_types") or []) == types
            and sorted(s.get("configuration_sets") or []) == sorted(d.configuration_sets)
        ):
            ok.append(f"stand-in SQS subscription to {queue}")
            return []
    return [
        Action(
            "standin",
            "subscribe",
            {
                "queue": queue,
                "queue_url": queue_url_of.get(queue),
                "topic_arn": d.topic_arn,
                "configuration_sets": list(d.configuration_sets),
                "event_types": types,
            },
            f"subscribe queue {queue} at the SES stand-in (raw delivery)",
        )
    ]


def _configuration_set(
    d: Desired,
    name: str,
    destinations: dict[str, dict[str, Any]] | None,
    ok: list[str],
    notes: list[str],
) -> list[Action]:
    wanted: dict[str, Any] = {"Enabled": True, "MatchingEventTypes": list(d.event_types)}
    if d.firehose is not None:
        where = f"Firehose {d.firehose.name}"
        wanted["KinesisFirehoseDestination"] = {
            "IamRoleArn": d.firehose.ses_role,
            "DeliveryStreamArn": d.firehose.arn,
        }
    else:
        where = "SNS"
        wanted["SnsDestination"] = {"TopicArn": d.topic_arn}
    actions = _configuration_set_if_missing("ses", name, destinations)
    destinations = destinations or {}
    have = destinations.get(d.destination)
    params = {
        "ConfigurationSetName": name,
        "EventDestinationName": d.destination,
        "EventDestination": wanted,
    }
    types = ", ".join(t.lower() for t in d.event_types)
    if have is None:
        actions.append(
            Action(
                "ses",
                "create_configuration_set_event_destination",
                params,
                f"add event destination {d.destination} to {name} ({types} → {where})",
            )
        )
    elif not _same_destination(have, wanted):
        actions.append(
            Action(
                "ses",
                "update_configuration_set_event_destination",
                params,
                f"update event destination {d.destination} of {name} ({types} → {where})",
            )
        )
    else:
        ok.append(f"SES configuration set {name} and its event destination {d.destination}")
    for other, dest in destinations.items():
        if other != d.destination:
            notes.append(f"event destination {other} of {name} is not ours: left as it is ({dest})")
    return actions


def _same_destination(have: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    kinds = ("SnsDestination", "KinesisFirehoseDestination")
    return (
        bool(have.get("Enabled")) == wanted["Enabled"]
        and sorted(have.get("MatchingEventTypes") or []) == sorted(wanted["MatchingEventTypes"])
        and all((have.get(k) or None) == wanted.get(k) for k in kinds)
    )
