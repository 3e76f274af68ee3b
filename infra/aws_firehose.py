"""The Firehose ingest path's AWS resources: the delivery stream `aws apply` makes, and the IAM
roles and S3 bucket it names but does not make (pure; `aws_plan.py` turns them into actions).

SES → (configuration set's event destination, role `ses_role`) → delivery stream (DirectPut,
HTTP endpoint = the webhook's /firehose, the first FLASHSEND_FIREHOSE_ACCESS_KEYS key) → the
webhook. What the stream cannot deliver within its retry duration it writes, with role
`backup_role`, to the S3 bucket.

The stream's settings and why:
- RetryOptions.DurationInSeconds 7200, Firehose's maximum: two hours of our side being down
  lose nothing (SNS allows one); after that the records are in the bucket, not gone.
- BufferingHints small (FLASHSEND_FIREHOSE_BUFFER_MB / _S, 1 MiB / 1 s): the feedback loop
  acts on bounces and complaints (a campaign is paused at a complaint rate within seconds),
  so an event waits at most the interval before it is sent, and Firehose bills the bytes,
  not the requests; at volume 1 MiB (~700 events) fills first, which keeps one request, and
  the work a retry repeats, small.
- ContentEncoding GZIP: SES event JSON compresses ~5:1, the webhook inflates it cheaply.
- S3BackupMode FailedDataOnly: only what could not be delivered goes to the bucket.

The access key cannot be read back from Firehose (a description never shows it), so the stream
carries a tag with the SHA-256 of the key it was given (`KEY_TAG`): a rotated key shows as a
change. Keys should be random (e.g. `openssl rand -hex 32`): the tag is readable by anyone who
may list the stream's tags.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

MAX_RETRY_S = 7200  # Firehose's maximum retry duration for an HTTP endpoint
KEY_TAG = "flashsend:access-key-sha256"
DESTINATION_NAME = "flashsend-webhook"


@dataclass(frozen=True)
class FirehoseStream:
    name: str
    region: str
    account: str
    url: str  # the webhook's public /firehose URL
    access_key: str
    ses_role: str  # ARN
    backup_role: str  # ARN
    bucket: str
    size_mb: int = 1
    interval_s: int = 10
    retry_s: int = MAX_RETRY_S

    @property
    def arn(self) -> str:
        return f"arn:aws:firehose:{self.region}:{self.account}:deliverystream/{self.name}"

    @property
    def bucket_arn(self) -> str:
        return f"arn:aws:s3:::{self.bucket}"

    @property
    def key_fingerprint(self) -> str:
        return hashlib.sha256(self.access_key.encode()).hexdigest()

    def destination(self) -> dict[str, Any]:
        """The HttpEndpointDestinationConfiguration (S3Configuration: S3Update in updates)."""
        return {
            "EndpointConfiguration": {
                "Url": self.url,
                "Name": DESTINATION_NAME,
                "AccessKey": self.access_key,
            },
            "BufferingHints": {"SizeInMBs": self.size_mb, "IntervalInSeconds": self.interval_s},
            "RetryOptions": {"DurationInSeconds": self.retry_s},
            "RequestConfiguration": {"ContentEncoding": "GZIP"},
            "S3BackupMode": "FailedDataOnly",
            "S3Configuration": {
                "RoleARN": self.backup_role,
                "BucketARN": self.bucket_arn,
                "Prefix": f"{self.name}/",
                "ErrorOutputPrefix": f"{self.name}-errors/",
                "CompressionFormat": "GZIP",
            },
        }


@dataclass(frozen=True)
class CurrentStream:
    """What DescribeDeliveryStream and ListTagsForDeliveryStream answered."""

    status: str
    version: str
    destination_id: str
    http: dict[str, Any]  # HttpEndpointDestinationDescription ({} : another kind of destination)
    tags: dict[str, str] = field(default_factory=dict)


def role_arn(role: str, account: str) -> str:
    """A role setting as an ARN: ARNs as they are, names in the sending account."""
    return role if role.startswith("arn:") else f"arn:aws:iam::{account}:role/{role}"


def default_bucket(stream: str, account: str) -> str:
    """`<stream>-<account>`: bucket names are global; the account id makes ours unique."""
    return f"{stream.lower().replace('_', '-').replace('.', '-')}-{account}"


def differences(s: FirehoseStream, c: CurrentStream) -> list[str]:
    """What differs between the stream wanted and the one there (empty: up to date)."""
    http = c.http
    if not http:
        return ["its destination is not an HTTP endpoint"]
    out = []
    if (http.get("EndpointConfiguration") or {}).get("Url") != s.url:
        out.append(f"endpoint {s.url}")
    hints = http.get("BufferingHints") or {}
    if (hints.get("SizeInMBs"), hints.get("IntervalInSeconds")) != (s.size_mb, s.interval_s):
        out.append(f"buffering {s.size_mb} MiB / {s.interval_s} s")
    if (http.get("RetryOptions") or {}).get("DurationInSeconds") != s.retry_s:
        out.append(f"retries for {s.retry_s} s")
    if (http.get("RequestConfiguration") or {}).get("ContentEncoding") != "GZIP":
        out.append("gzip")
    s3 = http.get("S3DestinationDescription") or {}
    if (s3.get("RoleARN"), s3.get("BucketARN")) != (s.backup_role, s.bucket_arn):
        out.append(f"S3 backup to {s.bucket}")
    if c.tags.get(KEY_TAG) != s.key_fingerprint:
        out.append("access key")
    return out


def create_params(s: FirehoseStream) -> dict[str, Any]:
    return {
        "DeliveryStreamName": s.name,
        "DeliveryStreamType": "DirectPut",
        "HttpEndpointDestinationConfiguration": s.destination(),
        "Tags": [{"Key": KEY_TAG, "Value": s.key_fingerprint}],
    }


def update_params(s: FirehoseStream, c: CurrentStream) -> dict[str, Any]:
    update = s.destination()
    update["S3Update"] = update.pop("S3Configuration")
    return {
        "DeliveryStreamName": s.name,
        "CurrentDeliveryStreamVersionId": c.version,
        "DestinationId": c.destination_id,
        "HttpEndpointDestinationUpdate": update,
    }


def tag_params(s: FirehoseStream) -> dict[str, Any]:
    return {"DeliveryStreamName": s.name, "Tags": [{"Key": KEY_TAG, "Value": s.key_fingerprint}]}


def _document(statements: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": statements}


def _trust(service: str, condition: dict[str, str]) -> dict[str, Any]:
    """A role's trust policy: `service` may assume it when `condition` holds (it names our
    account, so another account's resources cannot use the role: the confused deputy)."""
    return _document(
        [
            {
                "Effect": "Allow",
                "Principal": {"Service": service},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": condition},
            }
        ]
    )


def prerequisites(s: FirehoseStream) -> list[dict[str, Any]]:
    """The IAM roles and the bucket `apply` does not make: what each must be and allow."""
    return [
        {
            "kind": "iam-role",
            "arn": s.ses_role,
            "what": f"SES puts records into {s.name}",
            "trust": _trust("ses.amazonaws.com", {"AWS:SourceAccount": s.account}),
            "permissions": _document(
                [{"Effect": "Allow", "Action": "firehose:PutRecordBatch", "Resource": s.arn}]
            ),
        },
        {
            "kind": "iam-role",
            "arn": s.backup_role,
            "what": f"{s.name} writes undelivered records to s3://{s.bucket}",
            "trust": _trust("firehose.amazonaws.com", {"sts:ExternalId": s.account}),
            "permissions": _document(
                [
                    {
                        "Effect": "Allow",
                        "Action": [
                            "s3:AbortMultipartUpload",
                            "s3:GetBucketLocation",
                            "s3:GetObject",
                            "s3:ListBucket",
                            "s3:ListBucketMultipartUploads",
                            "s3:PutObject",
                        ],
                        "Resource": [s.bucket_arn, f"{s.bucket_arn}/*"],
                    }
                ]
            ),
        },
        {
            "kind": "s3-bucket",
            "arn": s.bucket_arn,
            "what": f"in {s.region}: the records {s.name} gave up on after {s.retry_s} s",
        },
    ]


def describe_prerequisite(p: dict[str, Any]) -> str:
    """One line for `aws plan`; `--json` prints the policy documents."""
    if p["kind"] == "s3-bucket":
        return f"S3 bucket {p['arn'].rpartition(':')[2]} {p['what']}"
    trusted = p["trust"]["Statement"][0]["Principal"]["Service"]
    allowed = p["permissions"]["Statement"][0]["Action"]
    actions = allowed if isinstance(allowed, str) else ", ".join(allowed)
    return f"IAM role {p['arn']} ({p['what']}): trusts {trusted}, allows {actions}"
