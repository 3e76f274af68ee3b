"""`flashsend aws plan|apply`: read what exists (boto3), plan (`aws_plan`), run the calls.

Real AWS when `FLASHSEND_SES_ENDPOINT` and `FLASHSEND_SQS_ENDPOINT` are both empty; local
when both point at the stack (SES stand-in, ElasticMQ; SNS is skipped: not emulated). A mix
is refused, as are missing credentials or a topic ARN of another account than the
credentials' own, before anything is read. The firehose path's stream is made with the
`firehose` client (locally: the stand-in's Firehose API); its IAM roles and S3 bucket are only
checked, against AWS (`iam`, `s3`), and a missing one stops `apply` before any change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from flashsend import deliverability
from flashsend.errors import FlashsendError, UsageError
from flashsend.settings import Settings
from infra.aws_firehose import CurrentStream
from infra.aws_plan import (
    Action,
    Current,
    CurrentSubscription,
    Desired,
    Options,
    Plan,
    desired,
    plan,
)

_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=20
)


class AwsSetupError(FlashsendError):
    """An AWS call of the set-up failed."""


def options_from(settings: Settings, path: str = "firehose") -> Options:
    """`path`: only the Firehose path reads (and checks) the Firehose access keys."""
    local = _local(settings)
    sets = tuple(
        s
        for s in (settings.marketing_configuration_set, settings.transactional_configuration_set)
        if s
    )
    return Options(
        topic_arn=settings.sns_topic_arns[0] if settings.sns_topic_arns else "",
        region=settings.ses_region,
        configuration_sets=sets,
        destination=settings.aws_events_destination,
        queue=settings.sqs_queue,
        retention_s=settings.sqs_retention_s,
        visibility_s=settings.events_visibility_s,
        max_receive_count=settings.sqs_max_receive_count,
        webhook_url=deliverability.public_url(settings) + deliverability.SNS_PATH,
        local=local,
        event_types=tuple(deliverability.matching_event_types(settings)),
        sms_configuration_set=settings.sms_configuration_set,
        sms_number=settings.sms_origination_identity,
        firehose_url=deliverability.public_url(settings) + deliverability.FIREHOSE_PATH,
        firehose_access_key=(
            next(iter(deliverability.firehose_access_keys(settings)), "")
            if path == "firehose"
            else ""
        ),
        firehose_stream=settings.firehose_stream,
        firehose_ses_role=settings.firehose_ses_role,
        firehose_backup_role=settings.firehose_backup_role,
        firehose_backup_bucket=settings.firehose_backup_bucket,
        firehose_buffer_mb=settings.firehose_buffer_mb,
        firehose_buffer_s=settings.firehose_buffer_s,
    )


def _local(settings: Settings) -> bool:
    ses_local = settings.ses_endpoint_url is not None
    sqs_local = settings.sqs_endpoint_url is not None
    if ses_local != sqs_local:
        raise UsageError(
            "SES and SQS must both be AWS (FLASHSEND_SES_ENDPOINT= and FLASHSEND_SQS_ENDPOINT= "
            "empty) or both local: now SES is "
            + ("local" if ses_local else "AWS")
            + " and SQS "
            + ("local" if sqs_local else "AWS")
        )
    return ses_local


@dataclass
class Clients:
    ses: Any
    sqs: Any
    sns: Any | None  # None locally
    standin: Any | None  # SqsSinkAdmin locally
    sms: Any | None = None  # pinpoint-sms-voice-v2; None locally
    firehose: Any | None = None
    iam: Any | None = None  # None locally (not emulated): the roles are not checked
    s3: Any | None = None  # None locally (not emulated): the bucket is not checked


def clients(settings: Settings) -> Clients:
    """boto3 clients for the set-up; for real AWS only after credentials were found and
    their account matched the topic's."""
    if settings.ses_endpoint_url:
        from infra.ses_standin.sqs_admin import SqsSinkAdmin
        from producers.sqs_client import boto3_sqs

        local_keys = {
            "aws_access_key_id": settings.ses_access_key_id,
            "aws_secret_access_key": settings.ses_secret_access_key.get_secret_value(),
        }
        ses = boto3.session.Session().client(
            "sesv2",
            endpoint_url=settings.ses_endpoint_url,
            region_name=settings.ses_region,
            config=_CONFIG,
            **local_keys,
        )
        firehose = boto3.session.Session().client(
            "firehose",
            endpoint_url=settings.ses_endpoint_url,
            region_name=settings.ses_region,
            config=_CONFIG,
            **local_keys,
        )
        return Clients(
            ses,
            boto3_sqs(settings),
            None,
            SqsSinkAdmin(settings.ses_endpoint_url),
            firehose=firehose,
        )
    session = boto3.session.Session(region_name=settings.ses_region)
    if session.get_credentials() is None:
        raise UsageError(
            "no AWS credentials: set AWS_PROFILE (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), "
            "or run where an instance role provides them"
        )
    try:
        account = session.client("sts", config=_CONFIG).get_caller_identity()["Account"]
    except (BotoCoreError, ClientError) as exc:
        raise UsageError(f"the AWS credentials do not work: {exc}") from exc
    topic_account = settings.sns_topic_arns[0].split(":")[4] if settings.sns_topic_arns else ""
    if topic_account and account != topic_account:
        raise UsageError(
            f"the credentials are of account {account}, FLASHSEND_SNS_TOPIC_ARNS names "
            f"{topic_account}: the topic must be in the sending account"
        )
    return Clients(
        session.client("sesv2", config=_CONFIG),
        session.client("sqs", config=_CONFIG),
        session.client("sns", config=_CONFIG),
        None,
        session.client("pinpoint-sms-voice-v2", config=_CONFIG),
        firehose=session.client("firehose", config=_CONFIG),
        iam=session.client("iam", config=_CONFIG),
        s3=session.client("s3", config=_CONFIG),
    )


def desired_for(settings: Settings, path: str) -> Desired:
    if not settings.ses_region:
        raise UsageError("no AWS Region: set FLASHSEND_SES_REGION (e.g. eu-west-1)")
    if not settings.sns_topic_arns:
        raise UsageError("no SNS topic: set FLASHSEND_SNS_TOPIC_ARNS")
    try:
        return desired(options_from(settings, path), path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# ---- reading what exists ------------------------------------------------------------------


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def read_current(d: Desired, c: Clients) -> Current:
    try:
        return Current(
            configuration_sets={name: _read_set(c.ses, name, d) for name in d.configuration_sets},
            queues={name: _read_queue(c.sqs, name) for name in d.queues},
            topic=None if c.sns is None else _read_topic(c.sns, d.topic_arn),
            subscriptions=() if c.sns is None else _read_subscriptions(c.sns, d.topic_arn),
            standin_subscriptions=(
                () if c.standin is None else tuple(c.standin.state()["subscriptions"])
            ),
            sms_destinations=(
                _read_sms_set(c.sms, d.sms_configuration_set)
                if c.sms is not None and d.sms_configuration_set
                else None
            ),
            sms_phone_number=(
                _read_phone_number(c.sms, d.sms_number)
                if c.sms is not None and d.sms_configuration_set and d.sms_number
                else None
            ),
            stream=(
                _read_stream(c.firehose, d.firehose.name)
                if c.firehose is not None and d.firehose is not None
                else None
            ),
            missing=_missing(c, d) if c.iam is not None and d.firehose is not None else None,
        )
    except (BotoCoreError, ClientError, OSError) as exc:
        raise AwsSetupError(f"reading the current set-up failed: {exc}") from exc


def _read_stream(firehose: Any, name: str) -> CurrentStream | None:
    try:
        found = firehose.describe_delivery_stream(DeliveryStreamName=name)
    except ClientError as exc:
        if _code(exc) == "ResourceNotFoundException":
            return None
        raise
    description = found["DeliveryStreamDescription"]
    [destination] = description["Destinations"][:1] or [{}]
    tags = firehose.list_tags_for_delivery_stream(DeliveryStreamName=name).get("Tags", [])
    return CurrentStream(
        status=str(description.get("DeliveryStreamStatus", "")),
        version=str(description.get("VersionId", "")),
        destination_id=str(destination.get("DestinationId", "")),
        http=dict(destination.get("HttpEndpointDestinationDescription") or {}),
        tags={str(t["Key"]): str(t.get("Value", "")) for t in tags},
    )


def _missing(c: Clients, d: Desired) -> tuple[str, ...]:
    """ARNs of the stream's IAM roles and bucket that do not exist (or cannot be seen)."""
    assert d.firehose is not None and c.iam is not None and c.s3 is not None
    out = []
    for arn in (d.firehose.ses_role, d.firehose.backup_role):
        try:
            c.iam.get_role(RoleName=arn.rpartition("/")[2])
        except ClientError as exc:
            if _code(exc) != "NoSuchEntity":
                raise
            out.append(arn)
    try:
        c.s3.head_bucket(Bucket=d.firehose.bucket, ExpectedBucketOwner=d.account)
    except ClientError as exc:
        if _code(exc) not in ("404", "403", "NoSuchBucket"):
            raise
        out.append(d.firehose.bucket_arn)
    return tuple(out)


def _read_set(ses: Any, name: str, d: Desired) -> dict[str, dict[str, Any]] | None:
    try:
        ses.get_configuration_set(ConfigurationSetName=name)
    except ClientError as exc:
        if _code(exc) == "NotFoundException":
            return None
        raise
    answer = ses.get_configuration_set_event_destinations(ConfigurationSetName=name)
    return {dest["Name"]: dest for dest in answer.get("EventDestinations", [])}


def _read_sms_set(sms: Any, name: str) -> dict[str, dict[str, Any]] | None:
    try:
        answer = sms.describe_configuration_sets(ConfigurationSetNames=[name])
    except ClientError as exc:
        if _code(exc) == "ResourceNotFoundException":
            return None
        raise
    found = answer.get("ConfigurationSets") or []
    if not found:
        return None
    return {d["EventDestinationName"]: d for d in found[0].get("EventDestinations", [])}


def _read_phone_number(sms: Any, identity: str) -> dict[str, Any] | None:
    """The account's phone number that `identity` names (its id, ARN or E.164 number)."""
    try:
        if identity.startswith(("phone-", "arn:")):
            numbers = sms.describe_phone_numbers(PhoneNumberIds=[identity])["PhoneNumbers"]
        else:
            pages = sms.get_paginator("describe_phone_numbers").paginate()
            numbers = [
                n
                for page in pages
                for n in page.get("PhoneNumbers", [])
                if n.get("PhoneNumber") == identity
            ]
    except ClientError as exc:
        if _code(exc) == "ResourceNotFoundException":
            return None
        raise
    return dict(numbers[0]) if numbers else None


def _read_queue(sqs: Any, name: str) -> tuple[str, dict[str, str]] | None:
    try:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    except ClientError as exc:
        if "NonExistentQueue" in _code(exc) or _code(exc) == "QueueDoesNotExist":
            return None
        raise
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    return str(url), dict(attributes.get("Attributes", {}))


def _read_topic(sns: Any, arn: str) -> dict[str, str] | None:
    try:
        return dict(sns.get_topic_attributes(TopicArn=arn)["Attributes"])
    except ClientError as exc:
        if _code(exc) == "NotFound":
            return None
        raise


def _read_subscriptions(sns: Any, arn: str) -> tuple[CurrentSubscription, ...]:
    out = []
    try:
        pages = sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=arn)
        subs = [s for page in pages for s in page.get("Subscriptions", [])]
    except ClientError as exc:
        if _code(exc) == "NotFound":
            return ()
        raise
    for s in subs:
        sub_arn = str(s["SubscriptionArn"])
        attributes: dict[str, str] = {}
        if sub_arn.startswith("arn:"):
            attributes = dict(
                sns.get_subscription_attributes(SubscriptionArn=sub_arn)["Attributes"]
            )
        out.append(CurrentSubscription(sub_arn, str(s["Protocol"]), str(s["Endpoint"]), attributes))
    return tuple(out)


# ---- applying -----------------------------------------------------------------------------


def execute(action: Action, c: Clients) -> None:
    if action.service == "standin":
        assert c.standin is not None
        params = dict(action.params)
        # The queue may have been created by an earlier action of this run.
        url = params.pop("queue_url") or c.sqs.get_queue_url(QueueName=params["queue"])["QueueUrl"]
        c.standin.subscribe(
            url,
            params["topic_arn"],
            configuration_sets=params["configuration_sets"],
            event_types=params["event_types"],
        )
        return
    client = {
        "ses": c.ses,
        "sqs": c.sqs,
        "sns": c.sns,
        "sms": c.sms,
        "firehose": c.firehose,
    }[action.service]
    try:
        getattr(client, action.operation)(**action.params)
        if action.operation == "create_delivery_stream":
            _wait_active(c.firehose, action.params["DeliveryStreamName"])
    except (BotoCoreError, ClientError) as exc:
        raise AwsSetupError(f"{action.summary}: {exc}") from exc


STREAM_ACTIVE_WAIT_S = 600.0


def _wait_active(firehose: Any, name: str) -> None:
    """A new stream is CREATING for a minute or so; SES and updates want it ACTIVE."""
    deadline = time.monotonic() + STREAM_ACTIVE_WAIT_S
    while True:
        found = firehose.describe_delivery_stream(DeliveryStreamName=name)
        status = found["DeliveryStreamDescription"]["DeliveryStreamStatus"]
        if status == "ACTIVE":
            return
        if status != "CREATING" or time.monotonic() > deadline:
            raise AwsSetupError(f"delivery stream {name} is {status}, not ACTIVE")
        time.sleep(5)


def apply(d: Desired, c: Clients, log: Callable[[str], None] = print) -> tuple[Plan, Plan]:
    """Run the plan's calls in order; return (the plan run, the plan afterwards)."""
    before = plan(d, read_current(d, c))
    if before.missing:
        raise AwsSetupError(
            "`apply` does not make IAM roles or S3 buckets, and these do not exist (or these "
            "credentials cannot see them): "
            + ", ".join(before.missing)
            + " (`flashsend aws plan --json` prints what each must allow); nothing was changed"
        )
    for action in before.actions:
        log(f"  {action.service:<7} {action.summary}")
        execute(action, c)
    after = plan(d, read_current(d, c))
    return before, after


def plan_json(p: Plan) -> dict[str, Any]:
    return {
        "changes": p.changes,
        "actions": [
            {
                "service": a.service,
                "operation": a.operation,
                "summary": a.summary,
                "params": _masked(a.params),
            }
            for a in p.actions
        ],
        "up_to_date": list(p.up_to_date),
        "notes": list(p.notes),
        "missing": list(p.missing),
    }


def _masked(value: Any) -> Any:
    """Params as printed: the stream's access key (a secret) replaced by asterisks."""
    if isinstance(value, dict):
        return {k: "***" if k == "AccessKey" else _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def describe(d: Desired) -> str:
    where = "local endpoints" if d.local else f"account {d.account}"
    return f"AWS set-up for the {d.path} ingest path (region {d.region}, {where})"


def ensure_local_firehose(settings: Settings) -> list[str]:
    """`flashsend up` with FLASHSEND_EVENTS_INGEST=firehose and the SES stand-in: what
    `aws apply --path firehose` makes there (the delivery stream to the webhook's /firehose,
    the SES configuration sets and their event destinations to it). Returns what was done."""
    before, after = apply(desired_for(settings, "firehose"), clients(settings), log=lambda _m: None)
    if after.changes:
        raise AwsSetupError(
            "the Firehose set-up at the stand-in is still different after apply: "
            + "; ".join(a.summary for a in after.actions)
        )
    return [a.summary for a in before.actions]


def ensure_local_queues(settings: Settings) -> list[str]:
    """`flashsend up` with `sqs`: the queues of the SQS path on the local server and, when
    the SES stand-in runs too, its SQS subscription (SES configuration sets are left to
    `flashsend aws apply`). Returns what was done."""
    d = desired_for(settings, "sqs")
    c = clients(settings)
    wanted = {"sqs"} | ({"standin"} if "ses" in settings.local_services else set())
    done = []
    for action in plan(d, read_current_queues(d, c, standin="standin" in wanted)).actions:
        if action.service in wanted:
            execute(action, c)
            done.append(action.summary)
    return done


def read_current_queues(d: Desired, c: Clients, *, standin: bool) -> Current:
    """Only the queues (and the stand-in's subscriptions): what `ensure_local_queues` needs."""
    try:
        return Current(
            configuration_sets={},
            queues={name: _read_queue(c.sqs, name) for name in d.queues},
            standin_subscriptions=(
                tuple(c.standin.state()["subscriptions"]) if standin and c.standin else ()
            ),
        )
    except (BotoCoreError, ClientError, OSError) as exc:
        raise AwsSetupError(f"reading the local queues failed: {exc}") from exc
