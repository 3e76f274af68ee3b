"""SNS verification against messages signed by our local signer (AWS's key is not available)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from producers.ses_events import parse_ses_message
from producers.sns_sign import (
    build_notification,
    build_subscription_confirmation,
    generate_signing_key,
    sign_message,
)
from producers.sns_verify import (
    AWS_SNS_HOST_PATTERN,
    CertificateUnavailable,
    HttpsCertificateSource,
    SnsMessage,
    SnsRejected,
    SnsVerifier,
    StaticCertificateSource,
    VerifierPolicy,
    check_cert_url,
    check_subscribe_url,
    parse_sns_body,
    string_to_sign,
)
from streams.rules.feedback_logic import ses_effect

FIXTURE = Path(__file__).parent.parent / "fixtures" / "sns" / "ses_bounce_notification.json"
TOPIC = "arn:aws:sns:us-east-1:123456789012:flashsend-ses-events"
OTHER_TOPIC = "arn:aws:sns:us-east-1:123456789012:flashsend-other"
CERT_URL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc123.pem"
SUBSCRIBE_URL = (
    "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription"
    f"&TopicArn={TOPIC}&Token=2336412f37fb687f5d51e6e2425"
)
NOW = datetime(2026, 5, 8, 12, 0, 10, tzinfo=UTC)
PUBLISHED = NOW - timedelta(seconds=5)
ConfirmationType = Literal["SubscriptionConfirmation", "UnsubscribeConfirmation"]


@pytest.fixture(scope="module")
def key() -> tuple[bytes, bytes]:
    return generate_signing_key(now=NOW)


@pytest.fixture(scope="module")
def verifier(key: tuple[bytes, bytes]) -> SnsVerifier:
    policy = VerifierPolicy(frozenset({TOPIC, OTHER_TOPIC}))
    return SnsVerifier(policy, StaticCertificateSource({CERT_URL: key[1]}))


def to_message(fields: dict[str, str], header: str | None = "") -> SnsMessage:
    """What the webhook does: serialise as SNS would, parse with the matching header."""
    body = json.dumps(fields).encode()
    return parse_sns_body(body, fields.get("Type") if header == "" else header)


def notification(key: tuple[bytes, bytes], version: int = 1, **overrides: str) -> dict[str, str]:
    fields = build_notification(TOPIC, '{"eventType":"Bounce"}', "Amazon SES", CERT_URL, PUBLISHED)
    return sign_message(fields | overrides, key[0], version)


def rejected(verifier: SnsVerifier, msg: SnsMessage) -> str:
    with pytest.raises(SnsRejected) as info:
        verifier.verify(msg, now=NOW)
    return info.value.reason


# --- accepted --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("subject", ["Amazon SES", "", None])
def test_signed_notifications_are_accepted(
    verifier: SnsVerifier, key: tuple[bytes, bytes], version: int, subject: str | None
) -> None:
    fields = build_notification(TOPIC, "line 1\nline 2 ü", subject, CERT_URL, PUBLISHED)
    msg = to_message(sign_message(fields, key[0], version))
    verifier.verify(msg, now=NOW)
    assert msg.signature_version == str(version)
    assert msg.subject == subject
    assert msg.published_at == PUBLISHED


@pytest.mark.parametrize("kind", ["SubscriptionConfirmation", "UnsubscribeConfirmation"])
@pytest.mark.parametrize("version", [1, 2])
def test_signed_confirmations_are_accepted(
    verifier: SnsVerifier, key: tuple[bytes, bytes], kind: ConfirmationType, version: int
) -> None:
    fields = build_subscription_confirmation(
        TOPIC, SUBSCRIBE_URL, "2336412f37fb", CERT_URL, PUBLISHED, message_type=kind
    )
    msg = to_message(sign_message(fields, key[0], version))
    verifier.verify(msg, now=NOW)
    assert (msg.type, msg.subscribe_url, msg.token) == (kind, SUBSCRIBE_URL, "2336412f37fb")


def test_string_to_sign_is_aws_canonical_form() -> None:
    with_subject = SnsMessage(
        type="Notification",
        message_id="m-1",
        topic_arn="arn:t",
        message="hi\nthere",
        timestamp="2026-05-08T12:00:05.000Z",
        signature_version="1",
        signature="",
        signing_cert_url=CERT_URL,
        subject="S",
    )
    assert string_to_sign(with_subject) == (
        b"Message\nhi\nthere\nMessageId\nm-1\nSubject\nS\n"
        b"Timestamp\n2026-05-08T12:00:05.000Z\nTopicArn\narn:t\nType\nNotification\n"
    )
    without = replace(with_subject, subject=None, unsubscribe_url="https://x/")
    assert string_to_sign(without) == (
        b"Message\nhi\nthere\nMessageId\nm-1\n"
        b"Timestamp\n2026-05-08T12:00:05.000Z\nTopicArn\narn:t\nType\nNotification\n"
    )
    confirmation = replace(
        with_subject, type="SubscriptionConfirmation", subscribe_url="https://s/", token="tok"
    )
    assert string_to_sign(confirmation) == (
        b"Message\nhi\nthere\nMessageId\nm-1\nSubscribeURL\nhttps://s/\n"
        b"Timestamp\n2026-05-08T12:00:05.000Z\nToken\ntok\nTopicArn\narn:t\n"
        b"Type\nSubscriptionConfirmation\n"
    )


# --- tampering -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"Message": '{"eventType":"Delivery"}'},
        {"Subject": "Amazon SES!"},
        {"MessageId": "00000000-0000-4000-8000-000000000000"},
        {"Timestamp": "2026-05-08T12:00:06.000Z"},
        {"TopicArn": OTHER_TOPIC},  # allowed topic, but not the one that was signed
        {"SignatureVersion": "2"},  # SHA1 signature presented as SHA256
    ],
)
def test_tampered_fields_fail_the_signature(
    verifier: SnsVerifier, key: tuple[bytes, bytes], change: dict[str, str]
) -> None:
    assert rejected(verifier, to_message(notification(key) | change)) == "bad_signature"


def test_removed_subject_and_bad_signatures_fail(
    verifier: SnsVerifier, key: tuple[bytes, bytes]
) -> None:
    fields = notification(key, version=2)
    del fields["Subject"]
    assert rejected(verifier, to_message(fields)) == "bad_signature"
    raw = bytearray(base64.b64decode(notification(key)["Signature"]))
    raw[-1] ^= 1
    flipped = notification(key) | {"Signature": base64.b64encode(raw).decode()}
    assert rejected(verifier, to_message(flipped)) == "bad_signature"
    assert rejected(verifier, to_message(notification(key) | {"Signature": "not base64!"})) == (
        "bad_signature"
    )


def test_a_key_other_than_the_certificates_fails(verifier: SnsVerifier) -> None:
    attacker = generate_signing_key(now=NOW)
    assert rejected(verifier, to_message(notification(attacker))) == "bad_signature"


# --- certificate and subscribe URLs ----------------------------------------------------------

EVIL_CERT_URLS = [
    "http://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://evil.com/sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.us-east-1.amazonaws.com.evil.com/SimpleNotificationService-abc.pem",
    "https://sns.us-east-1.amazonaws.com.cn.evil.com/x.pem",
    "https://sns.us-east-1.amazonaws.com@evil.com/x.pem",
    "https://sns.us-east-1.amazonaws.com:443@evil.com/x.pem",
    "https://evil.com@sns.us-east-1.amazonaws.com/x.pem",
    "https://sns.us-east-1.amazonaws.com:443/x.pem",
    "https://sns.us-east-1.amazonaws.com:8443/x.pem",
    "https://sns.us-east-1.amazonaws.com./x.pem",
    "https://evilsns.us-east-1.amazonaws.com/x.pem",
    "https://sns.us-east-1.evil.com/x.pem",
    "https://sns.evil.amazonaws.com/x.pem",
    "https://sqs.us-east-1.amazonaws.com/x.pem",
    "https://sns.us-east-1.amazonaws.com%2eevil.com/x.pem",
    "https://sns.us-east-1.amazonaws.com\\@evil.com/x.pem",
    "https://evil.com\\@sns.us-east-1.amazonaws.com/x.pem",
    "https://evil.com#@sns.us-east-1.amazonaws.com/x.pem",
    "https://evil.com?@sns.us-east-1.amazonaws.com/x.pem",
    "https://sns.us-east-1.amazonaws.com\u3002evil.com/x.pem",
    "https://SNS.US-EAST-1.AMAZONAWS.COM/x.pem",
    "HTTPS://sns.us-east-1.amazonaws.com/x.pem",
    "https:/sns.us-east-1.amazonaws.com/x.pem",
    "https:///sns.us-east-1.amazonaws.com/x.pem",
    "//sns.us-east-1.amazonaws.com/x.pem",
    " https://sns.us-east-1.amazonaws.com/x.pem",
    "https://sns.us-east-1.amazonaws.com/x.pem\n",
    "https://sns.us-east-1.amazon\taws.com/x.pem",
    "ftp://sns.us-east-1.amazonaws.com/x.pem",
    # host right, path wrong
    "https://sns.us-east-1.amazonaws.com/x",
    "https://sns.us-east-1.amazonaws.com/x.pem.txt",
    "https://sns.us-east-1.amazonaws.com/x?a=.pem",
    "https://sns.us-east-1.amazonaws.com/x.pem?a=b",
    "https://sns.us-east-1.amazonaws.com/x.pem#frag",
    "",
]


@pytest.mark.parametrize("url", EVIL_CERT_URLS)
def test_cert_urls_off_sns_hosts_are_refused(
    verifier: SnsVerifier, key: tuple[bytes, bytes], url: str
) -> None:
    with pytest.raises(SnsRejected) as info:
        check_cert_url(url, allowed_host_pattern=AWS_SNS_HOST_PATTERN)
    assert info.value.reason == "cert_url_not_allowed"
    # Through the verifier too, even when the signature is good and the source would answer.
    fields = sign_message(notification(key) | {"SigningCertURL": url}, key[0], 1)
    certs = StaticCertificateSource({url: key[1]})
    with pytest.raises(SnsRejected) as info:
        SnsVerifier(verifier.policy, certs).verify(to_message(fields), now=NOW)
    assert info.value.reason == "cert_url_not_allowed"


@pytest.mark.parametrize(
    "host",
    [
        "sns.us-east-1.amazonaws.com",
        "sns.eu-central-2.amazonaws.com",
        "sns.ap-southeast-2.amazonaws.com",
        "sns.us-gov-west-1.amazonaws.com",
        "sns.cn-north-1.amazonaws.com.cn",
    ],
)
def test_sns_hosts_in_every_partition_are_allowed(host: str) -> None:
    check_cert_url(
        f"https://{host}/SimpleNotificationService-0a1b.pem",
        allowed_host_pattern=AWS_SNS_HOST_PATTERN,
    )
    check_subscribe_url(
        f"https://{host}/?Action=ConfirmSubscription&Token=x",
        allowed_host_pattern=AWS_SNS_HOST_PATTERN,
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://evil.com/?Action=ConfirmSubscription",
        "https://sns.us-east-1.amazonaws.com.evil.com/?Action=ConfirmSubscription",
        "https://evil.com@sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription",
        "http://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription",
        "https://169.254.169.254/latest/meta-data/",
    ],
)
def test_confirmations_with_a_foreign_subscribe_url_are_refused(
    verifier: SnsVerifier, key: tuple[bytes, bytes], url: str
) -> None:
    fields = build_subscription_confirmation(TOPIC, url, "tok", CERT_URL, PUBLISHED)
    msg = to_message(sign_message(fields, key[0], 2))
    assert rejected(verifier, msg) == "subscribe_url_not_allowed"


def test_local_policy_allows_exactly_its_http_authority(key: tuple[bytes, bytes]) -> None:
    local_url = "http://127.0.0.1:8123/sns-cert.pem"
    fields = sign_message(notification(key) | {"SigningCertURL": local_url}, key[0], 2)
    certs = StaticCertificateSource({local_url: key[1]})
    SnsVerifier(VerifierPolicy.for_local(frozenset({TOPIC}), "127.0.0.1:8123"), certs).verify(
        to_message(fields), now=NOW
    )
    for policy in (
        VerifierPolicy(frozenset({TOPIC})),  # production: AWS hosts only
        VerifierPolicy.for_local(frozenset({TOPIC}), "127.0.0.1:8124"),
    ):
        with pytest.raises(SnsRejected, match="cert_url_not_allowed"):
            SnsVerifier(policy, certs).verify(to_message(fields), now=NOW)


# --- policy ----------------------------------------------------------------------------------


def test_unexpected_topic_is_refused_before_any_fetch(key: tuple[bytes, bytes]) -> None:
    fields = sign_message(notification(key) | {"TopicArn": "arn:aws:sns:us-east-1:6:x"}, key[0], 1)
    empty_source = StaticCertificateSource({})  # a fetch would raise CertificateUnavailable
    verifier = SnsVerifier(VerifierPolicy(frozenset({TOPIC})), empty_source)
    with pytest.raises(SnsRejected, match="topic_not_allowed"):
        verifier.verify(to_message(fields), now=NOW)


@pytest.mark.parametrize("version", ["3", "0", "", "01", "1.0", "SHA256"])
def test_unsupported_signature_versions_are_refused(
    verifier: SnsVerifier, key: tuple[bytes, bytes], version: str
) -> None:
    msg = to_message(notification(key) | {"SignatureVersion": version})
    assert rejected(verifier, msg) == "unsupported_signature_version"


def test_policy_can_refuse_sha1(key: tuple[bytes, bytes]) -> None:
    policy = VerifierPolicy(frozenset({TOPIC}), signature_versions=frozenset({"2"}))
    verifier = SnsVerifier(policy, StaticCertificateSource({CERT_URL: key[1]}))
    verifier.verify(to_message(notification(key, version=2)), now=NOW)
    assert rejected(verifier, to_message(notification(key, version=1))) == (
        "unsupported_signature_version"
    )


def test_age_is_unchecked_by_default_and_bounded_when_configured(
    verifier: SnsVerifier, key: tuple[bytes, bytes]
) -> None:
    msg = to_message(notification(key))
    verifier.verify(msg, now=NOW + timedelta(days=2))  # a late retry or replay: dedupe handles it
    strict = SnsVerifier(replace(verifier.policy, max_age=timedelta(hours=2)), verifier.certs)
    strict.verify(msg, now=NOW + timedelta(hours=1, minutes=59))
    strict.verify(msg, now=PUBLISHED - timedelta(minutes=4))  # within clock skew
    for now in (NOW + timedelta(hours=2, seconds=1), PUBLISHED - timedelta(minutes=6)):
        with pytest.raises(SnsRejected, match="stale"):
            strict.verify(msg, now=now)


def test_policy_refuses_dangerous_settings() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        VerifierPolicy(frozenset())
    with pytest.raises(ValueError, match="non-empty"):
        VerifierPolicy(TOPIC)  # type: ignore[arg-type]  # a str is a set of characters
    with pytest.raises(ValueError, match="retry window"):
        VerifierPolicy(frozenset({TOPIC}), max_age=timedelta(minutes=30))
    with pytest.raises(ValueError, match="subset"):
        VerifierPolicy(frozenset({TOPIC}), signature_versions=frozenset({"3"}))


# --- certificates ----------------------------------------------------------------------------


def test_certificate_problems(verifier: SnsVerifier, key: tuple[bytes, bytes]) -> None:
    msg = to_message(notification(key))
    with pytest.raises(CertificateUnavailable):  # transient: not a verdict on the message
        SnsVerifier(verifier.policy, StaticCertificateSource({})).verify(msg, now=NOW)
    garbage = SnsVerifier(verifier.policy, StaticCertificateSource({CERT_URL: b"<html>"}))
    assert rejected(garbage, msg) == "bad_certificate"
    with pytest.raises(SnsRejected, match="cert_expired"):
        verifier.verify(msg, now=NOW + timedelta(days=3651))


class _CertServer(BaseHTTPRequestHandler):
    pem = b""
    hits: list[str] = []  # noqa: RUF012  # shared with the test on purpose

    def do_GET(self) -> None:
        self.hits.append(self.path)
        status, body, extra = {
            "/ok.pem": (200, self.pem, {}),
            "/html.pem": (200, b"<html>error</html>", {}),
            "/big.pem": (200, self.pem * 100, {}),
            "/missing.pem": (404, b"", {}),
            "/moved.pem": (302, b"", {"Location": "/ok.pem"}),
        }[self.path]
        self.send_response(status)
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def cert_server(key: tuple[bytes, bytes]) -> Iterator[str]:
    _CertServer.pem, _CertServer.hits = key[1], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CertServer)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_https_source_caches_and_refuses_redirects(
    cert_server: str, key: tuple[bytes, bytes]
) -> None:
    source = HttpsCertificateSource(timeout=2, allow_http=True)
    assert source.get(f"{cert_server}/ok.pem") == key[1]
    assert source.get(f"{cert_server}/ok.pem") == key[1]
    assert _CertServer.hits == ["/ok.pem"]
    for path in ("/moved.pem", "/missing.pem", "/html.pem", "/html.pem", "/big.pem"):
        with pytest.raises(CertificateUnavailable):
            source.get(f"{cert_server}{path}")
    assert _CertServer.hits.count("/html.pem") == 2  # failures are not cached
    assert "/ok.pem" not in _CertServer.hits[1:]  # the redirect was not followed
    with pytest.raises(CertificateUnavailable, match="refusing"):
        HttpsCertificateSource().get(f"{cert_server}/ok.pem")  # http needs allow_http


# --- parsing ---------------------------------------------------------------------------------


def test_unknown_type_and_header_mismatch(key: tuple[bytes, bytes]) -> None:
    fields = notification(key)
    with pytest.raises(SnsRejected, match="unsupported_type"):
        to_message(fields | {"Type": "Bogus"})
    for header in ("SubscriptionConfirmation", "notification", None):
        with pytest.raises(SnsRejected, match="type_mismatch"):
            to_message(fields, header=header)


def _without(fields: dict[str, str], key: str) -> dict[str, str]:
    return {k: v for k, v in fields.items() if k != key}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"\xff\xfe{}",
        b"[]",
        b'"Notification"',
        b"{}",
        b"[" * 100_000,
        b" " * (1024 * 1024 + 1),
    ],
)
def test_malformed_bodies(body: bytes) -> None:
    with pytest.raises(SnsRejected, match="malformed"):
        parse_sns_body(body, "Notification")


def test_malformed_fields(key: tuple[bytes, bytes]) -> None:
    fields = notification(key)
    bad: list[Mapping[str, object]] = [
        _without(fields, name)
        for name in (
            "MessageId",
            "TopicArn",
            "Message",
            "Timestamp",
            "SignatureVersion",
            "Signature",
            "SigningCertURL",
        )
    ]
    bad += [
        fields | {"SignatureVersion": 1},
        fields | {"Message": {"eventType": "Bounce"}},
        fields | {"Subject": 5},
        fields | {"Timestamp": "2026-05-08 12:00:05"},
        fields | {"Timestamp": "yesterday"},
    ]
    for case in bad:
        with pytest.raises(SnsRejected, match="malformed"):
            parse_sns_body(json.dumps(case).encode(), "Notification")
    duplicate = json.dumps(fields)[:-1] + ', "Message": "forged"}'
    with pytest.raises(SnsRejected, match="malformed"):
        parse_sns_body(duplicate.encode(), "Notification")
    confirmation = build_subscription_confirmation(TOPIC, SUBSCRIBE_URL, "t", CERT_URL, NOW)
    for name in ("Token", "SubscribeURL"):
        with pytest.raises(SnsRejected, match="malformed"):
            to_message(sign_message(_without(confirmation, name), key[0], 1))


# --- AWS-shaped fixture ----------------------------------------------------------------------


def test_aws_shaped_ses_bounce_fixture(key: tuple[bytes, bytes]) -> None:
    """An SES bounce notification shaped as AWS delivers it, signed the way AWS documents it
    (string to sign written out here, not produced by our signer, which shares the verifier's
    canonical form and would agree with any bug in it): accepted with SignatureVersion 1 and 2;
    a change to any signed field is rejected; its message becomes the ses_event record the
    webhook publishes and the suppression the feedback agent writes.

    Naive versions caught: a canonical form missing a key or in another order (the documented
    signature fails), a verifier that does not cover a field (the tampered copy passes)."""
    envelope = json.loads(FIXTURE.read_bytes())
    assert envelope["TopicArn"] == TOPIC and "Subject" not in envelope
    documented = (  # AWS: Message, MessageId, Subject (absent here), Timestamp, TopicArn, Type
        f"Message\n{envelope['Message']}\nMessageId\n{envelope['MessageId']}\n"
        f"Timestamp\n{envelope['Timestamp']}\nTopicArn\n{envelope['TopicArn']}\n"
        "Type\nNotification\n"
    ).encode()
    private = serialization.load_pem_private_key(key[0], password=None)
    assert isinstance(private, rsa.RSAPrivateKey)
    signing_cert_url = envelope["SigningCertURL"]
    verifier = SnsVerifier(
        VerifierPolicy(frozenset({TOPIC, OTHER_TOPIC})),
        StaticCertificateSource({signing_cert_url: key[1]}),
    )
    published = datetime.fromisoformat(envelope["Timestamp"].replace("Z", "+00:00"))
    now = published + timedelta(seconds=1)
    for version, digest in ((1, hashes.SHA1()), (2, hashes.SHA256())):
        signature = base64.b64encode(private.sign(documented, padding.PKCS1v15(), digest))
        signed = {**envelope, "SignatureVersion": str(version), "Signature": signature.decode()}
        msg = parse_sns_body(json.dumps(signed).encode(), "Notification")
        verifier.verify(msg, now=now)
        changes = {
            "Message": envelope["Message"].replace("Permanent", "Transient"),
            "MessageId": envelope["MessageId"][:-1] + "0",
            "Timestamp": envelope["Timestamp"].replace(".789Z", ".788Z"),
            "TopicArn": OTHER_TOPIC,
        }
        for field_name, value in changes.items():
            tampered = parse_sns_body(
                json.dumps({**signed, field_name: value}).encode(), "Notification"
            )
            with pytest.raises(SnsRejected, match="bad_signature"):
                verifier.verify(tampered, now=now)

    records = parse_ses_message(
        msg.message, sns_message_id=msg.message_id, received_at_ms=int(now.timestamp() * 1000)
    )
    assert [
        (r["recipient"], r["event_type"], r["bounce_type"], r["campaign_id"], r["seq"])
        for r in records
    ] == [("recipient@example.com", "Bounce", "Permanent", 42, 7)]
    effect = ses_effect(records[0])
    assert (effect.email, effect.suppress_reason, effect.counter, effect.campaign_id) == (
        "recipient@example.com",
        "bounce",
        "bounced",
        42,
    )


# --- what the verifier keeps between messages ------------------------------------------------


class _CountingSource:
    """A certificate source that says how often it was asked (the verifier's only input)."""

    def __init__(self, pem: bytes) -> None:
        self.pem = pem
        self.calls = 0

    def get(self, url: str) -> bytes:
        self.calls += 1
        return self.pem


def test_the_certificate_is_fetched_and_parsed_once_per_url(key: tuple[bytes, bytes]) -> None:
    source = _CountingSource(key[1])
    verifier = SnsVerifier(VerifierPolicy(frozenset({TOPIC})), source)
    for _ in range(3):
        verifier.verify(to_message(notification(key, version=2)), now=NOW)
    assert source.calls == 1


def test_a_kept_key_still_checks_every_signature_and_the_validity(
    key: tuple[bytes, bytes],
) -> None:
    source = _CountingSource(key[1])
    verifier = SnsVerifier(VerifierPolicy(frozenset({TOPIC})), source)
    verifier.verify(to_message(notification(key)), now=NOW)  # the key is now kept
    tampered = notification(key) | {"Message": "forged"}
    assert rejected(verifier, to_message(tampered)) == "bad_signature"
    other_key, _ = generate_signing_key(now=NOW)
    forged = sign_message(
        build_notification(TOPIC, '{"eventType":"Bounce"}', None, CERT_URL, PUBLISHED),
        other_key,
        1,
    )
    assert rejected(verifier, to_message(forged)) == "bad_signature"
    with pytest.raises(SnsRejected, match="cert_expired"):
        verifier.verify(to_message(notification(key)), now=NOW + timedelta(days=3651))
    assert source.calls == 1


def test_a_kept_key_does_not_let_another_url_skip_the_url_check(
    key: tuple[bytes, bytes],
) -> None:
    verifier = SnsVerifier(VerifierPolicy(frozenset({TOPIC})), _CountingSource(key[1]))
    verifier.verify(to_message(notification(key)), now=NOW)
    evil = CERT_URL.replace("sns.us-east-1.amazonaws.com", "sns.us-east-1.amazonaws.com.evil.io")
    assert rejected(verifier, to_message(notification(key, SigningCertURL=evil))) == (
        "cert_url_not_allowed"
    )


def test_an_unparseable_certificate_is_not_kept(key: tuple[bytes, bytes]) -> None:
    source = _CountingSource(b"<html>busy</html>")
    verifier = SnsVerifier(VerifierPolicy(frozenset({TOPIC})), source)
    msg = to_message(notification(key))
    assert rejected(verifier, msg) == "bad_certificate"
    source.pem = key[1]  # the source recovers: the next message is verified
    verifier.verify(msg, now=NOW)
    assert source.calls == 2
