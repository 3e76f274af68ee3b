"""Sign SNS envelopes the way SNS does, with a key of our own.

Why: AWS's signing key is not available here, yet the webhook must be tested end to end with
real signatures (not a verifier switched off), and the SES stand-in must POST event records that
the production verifier accepts when configured with our certificate
(`VerifierPolicy.for_local` + `StaticCertificateSource`, or the certificate served over http).

The canonical string comes from `sns_verify.string_to_sign_fields`, so signer and verifier share
one definition; tests pin that definition against hand-written bytes.
"""

from __future__ import annotations

import base64
import functools
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from producers.sns_verify import string_to_sign_fields

_HASHES: dict[int, type[hashes.HashAlgorithm]] = {1: hashes.SHA1, 2: hashes.SHA256}


def generate_signing_key(
    *,
    common_name: str = "flashsend local SNS signer",
    now: datetime | None = None,
    key_size: int = 2048,
) -> tuple[bytes, bytes]:
    """A fresh RSA key (2048 bits, as SNS's) and a self-signed certificate for it:
    `(private_key_pem, cert_pem)`.

    Valid from a day before `now` (clock skew) for ten years, so a long-lived local stack and
    tests with fixed timestamps keep verifying.
    """
    now = now or datetime.now(UTC)
    key = rsa.generate_private_key(public_exponent=65537, key_size=key_size)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return private_pem, cert.public_bytes(serialization.Encoding.PEM)


@functools.lru_cache(maxsize=8)
def _load_key(private_key_pem: bytes) -> rsa.RSAPrivateKey:
    # Loading checks the RSA key (~80 ms); the SES stand-in signs every event with one key.
    key = serialization.load_pem_private_key(private_key_pem, password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("SNS signatures need an RSA key")
    return key


def sign_message(fields: Mapping[str, str], private_key_pem: bytes, version: int) -> dict[str, str]:
    """A copy of `fields` with `SignatureVersion` and `Signature` set (version 1 = SHA1,
    2 = SHA256, RSA PKCS#1 v1.5), exactly what SNS puts on the wire."""
    if version not in _HASHES:
        raise ValueError(f"SignatureVersion must be 1 or 2, got {version}")
    key = _load_key(private_key_pem)
    signed = {k: v for k, v in fields.items() if k not in ("Signature", "SignatureVersion")}
    raw = key.sign(string_to_sign_fields(signed), padding.PKCS1v15(), _HASHES[version]())
    signed["SignatureVersion"] = str(version)
    signed["Signature"] = base64.b64encode(raw).decode("ascii")
    return signed


def format_timestamp(now: datetime) -> str:
    """SNS's form: UTC, millisecond precision, `Z` (e.g. `2026-05-09T07:35:25.123Z`)."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def build_notification(
    topic_arn: str,
    message: str,
    subject: str | None,
    cert_url: str,
    now: datetime,
    *,
    unsubscribe_url: str | None = None,
) -> dict[str, str]:
    """Unsigned Notification envelope (pass it to `sign_message`); a new uuid4 MessageId."""
    fields = {
        "Type": "Notification",
        "MessageId": str(uuid.uuid4()),
        "TopicArn": topic_arn,
        "Message": message,
        "Timestamp": format_timestamp(now),
        "SigningCertURL": cert_url,
    }
    if subject is not None:
        fields["Subject"] = subject
    if unsubscribe_url is not None:
        fields["UnsubscribeURL"] = unsubscribe_url
    return fields


def build_subscription_confirmation(
    topic_arn: str,
    subscribe_url: str,
    token: str,
    cert_url: str,
    now: datetime,
    *,
    message_type: Literal[
        "SubscriptionConfirmation", "UnsubscribeConfirmation"
    ] = "SubscriptionConfirmation",
) -> dict[str, str]:
    """Unsigned SubscriptionConfirmation (or UnsubscribeConfirmation) envelope."""
    if message_type == "SubscriptionConfirmation":
        message = (
            f"You have chosen to subscribe to the topic {topic_arn}.\n"
            "To confirm the subscription, visit the SubscribeURL included in this message."
        )
    else:
        message = (
            f"You have chosen to deactivate subscription {topic_arn}.\n"
            "To cancel this operation and restore the subscription, visit the SubscribeURL"
            " included in this message."
        )
    return {
        "Type": message_type,
        "MessageId": str(uuid.uuid4()),
        "Token": token,
        "TopicArn": topic_arn,
        "Message": message,
        "SubscribeURL": subscribe_url,
        "Timestamp": format_timestamp(now),
        "SigningCertURL": cert_url,
    }
