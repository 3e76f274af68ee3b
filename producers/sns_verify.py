"""Verify the SNS HTTP POSTs that carry SES events back to us.

Why our own: the PyPI validators are SHA1-only or fetch `SubscribeURL` unchecked.

- A valid signature only proves that *some* SNS topic sent the message: anyone can subscribe our
  webhook to a topic of their own and publish forged bounces through real SNS. The `TopicArn`
  allow-list makes it ours, so a policy cannot be built without one.
- The certificate URL is attacker input: a "certificate" from any other host would let them sign
  with their own key. The whole URL authority must match an SNS host (no userinfo, port or
  suffix tricks) and the fetch follows no redirect.
- Cheap checks (type, version, topic, URLs, age) run before any certificate fetch.

Pure but for `HttpsCertificateSource`. `CertificateUnavailable` is transient (answer 5xx, SNS
retries); `SnsRejected` is a verdict on the message (answer 4xx or 200: a retry won't help).
"""

from __future__ import annotations

import base64
import binascii
import functools
import http.client
import json
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, get_args
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from flashsend.errors import FlashsendError

# sns.<region>.amazonaws.com(.cn), fullmatched against the whole authority (no port or userinfo).
AWS_SNS_HOST_PATTERN = r"sns\.[a-z]{2}(?:-[a-z]+)+-[0-9]{1,2}\.amazonaws\.com(?:\.cn)?"
# SNS caps a message at 256 KiB; JSON escaping inside the envelope can roughly double it.
MAX_BODY_BYTES = 1024 * 1024
# SNS gives up on an HTTP/S endpoint after at most 3,600 s of retries (a hard AWS limit).
SNS_MAX_RETRY_WINDOW = timedelta(seconds=3600)
_MAX_CERT_BYTES = 64 * 1024

MessageType = Literal["Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation"]
_MESSAGE_TYPES = frozenset(get_args(MessageType))
# Signed keys, in AWS's order, per type.
_NOTIFICATION_KEYS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
_CONFIRM_KEYS = ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
_CONF = ("subscribe_url", "token")  # SnsMessage attributes optional but for confirmations
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}
# Printable ASCII without space or backslash: anything else is a parser-differential vector.
_URL_CHARS = re.compile(r"[!-\[\]-~]{1,2048}")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?Z")


class SnsRejected(FlashsendError):
    """The SNS message was rejected."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason  # short, machine-readable: use it for metrics and the HTTP answer
        super().__init__(f"{reason}: {detail[:200]!r}" if detail else reason)


class CertificateUnavailable(FlashsendError):
    """The SNS signing certificate could not be fetched (transient: let SNS retry)."""


@dataclass(frozen=True)
class SnsMessage:
    """One SNS envelope; `timestamp` stays the exact signed string."""

    type: MessageType
    message_id: str
    topic_arn: str
    message: str
    timestamp: str
    signature_version: str
    signature: str
    signing_cert_url: str
    subject: str | None = None
    subscribe_url: str | None = None
    token: str | None = None
    unsubscribe_url: str | None = None

    @property
    def published_at(self) -> datetime:
        return datetime.fromisoformat(self.timestamp)


def _aws_key(attr: str) -> str:
    """SnsMessage attribute -> envelope key: `message_id` -> `MessageId`, `..._url` -> `...URL`."""
    return "".join(part.capitalize() for part in attr.split("_")).replace("Url", "URL")


# (attribute, envelope key, required in a notification, required in a confirmation), computed
# once: parse_sns_body and string_to_sign run for every POST.
_FIELDS = tuple(
    (f.name, _aws_key(f.name), f.default is MISSING, f.default is MISSING or f.name in _CONF)
    for f in fields(SnsMessage)
)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Two parsers may pick different copies of a repeated key: refuse the ambiguity."""
    result = dict(pairs)
    if len(result) != len(pairs):
        raise SnsRejected("malformed", "duplicate key")
    return result


def parse_sns_body(body: bytes, header_type: str | None) -> SnsMessage:
    """Parse a POST body; `header_type` is `x-amz-sns-message-type` (None = header missing)."""
    if len(body) > MAX_BODY_BYTES:
        raise SnsRejected("malformed", "body too large")
    try:
        data = json.loads(body, object_pairs_hook=_no_duplicate_keys)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError
        raise SnsRejected("malformed", "not JSON") from e
    if not isinstance(data, dict):
        raise SnsRejected("malformed", "not a JSON object")

    body_type = data.get("Type")
    if not isinstance(body_type, str):
        raise SnsRejected("malformed", "Type missing or not a string")
    if body_type not in _MESSAGE_TYPES:
        raise SnsRejected("unsupported_type", body_type)
    if header_type != body_type:
        raise SnsRejected("type_mismatch", f"header {header_type!r}, body {body_type!r}")
    confirmation = body_type != "Notification"
    values: dict[str, str | None] = {}
    for attr, key, for_notification, for_confirmation in _FIELDS:
        v = data.get(key)
        if not (
            isinstance(v, str)
            or (v is None and not (for_confirmation if confirmation else for_notification))
        ):
            raise SnsRejected("malformed", f"{key} missing or not a string")
        values[attr] = v
    if not _TIMESTAMP.fullmatch(str(values["timestamp"])):
        raise SnsRejected("malformed", "Timestamp")
    return SnsMessage(**values)  # type: ignore[arg-type]  # required keys checked above


def string_to_sign_fields(envelope: Mapping[str, str | None]) -> bytes:
    """AWS's canonical form: key, LF, value, LF for each signed key in AWS's order. A None value
    is skipped, which only Subject may be (parse_sns_body requires the others)."""
    keys = _NOTIFICATION_KEYS if envelope.get("Type") == "Notification" else _CONFIRM_KEYS
    pairs = ((key, envelope.get(key)) for key in keys)
    return "".join(f"{key}\n{v}\n" for key, v in pairs if v is not None).encode("utf-8")


def string_to_sign(msg: SnsMessage) -> bytes:
    """`string_to_sign_fields` of the message's envelope; a notification's written out, as it
    is the one verified for every event."""
    if msg.type != "Notification":
        return string_to_sign_fields({key: getattr(msg, attr) for attr, key, _n, _c in _FIELDS})
    subject = "" if msg.subject is None else f"Subject\n{msg.subject}\n"
    return (
        f"Message\n{msg.message}\nMessageId\n{msg.message_id}\n{subject}"
        f"Timestamp\n{msg.timestamp}\nTopicArn\n{msg.topic_arn}\nType\nNotification\n"
    ).encode()


def _url_allowed(url: str, host_pattern: str, allow_http: bool, *, pem: bool) -> bool:
    if not _URL_CHARS.fullmatch(url):
        return False
    parts = urlsplit(url)
    return (
        parts.scheme in (("https", "http") if allow_http else ("https",))
        and url.startswith(f"{parts.scheme}://")  # lowercase scheme, then the authority
        and re.fullmatch(host_pattern, parts.netloc) is not None
        and (not pem or (parts.path.endswith(".pem") and "?" not in url and "#" not in url))
    )


def check_cert_url(url: str, *, allowed_host_pattern: str, allow_http: bool = False) -> None:
    """SigningCertURL: https, authority fully matching the pattern, path ending in `.pem`."""
    if not _url_allowed(url, allowed_host_pattern, allow_http, pem=True):
        raise SnsRejected("cert_url_not_allowed", url)


def check_subscribe_url(url: str, *, allowed_host_pattern: str, allow_http: bool = False) -> None:
    """SubscribeURL: same scheme and host rule as the certificate; any path and query."""
    if not _url_allowed(url, allowed_host_pattern, allow_http, pem=False):
        raise SnsRejected("subscribe_url_not_allowed", url)


@dataclass(frozen=True)
class VerifierPolicy:
    """What we accept. Production: `VerifierPolicy(frozenset({arn}))`; AWS hosts, https only.

    `max_age` is None by default: replays are handled by deduplicating on MessageId, and an age
    limit can only lose real events (a retried bounce keeps its original Timestamp; a clock
    skewed by minutes would drop them). When set it must exceed SNS's 1-hour retry window.
    """

    allowed_topic_arns: frozenset[str]
    cert_host_pattern: str = AWS_SNS_HOST_PATTERN
    allow_http: bool = False  # only for the local stack, together with a loopback pattern
    signature_versions: frozenset[str] = frozenset(_HASHES)  # frozenset({"2"}) to refuse SHA1
    max_age: timedelta | None = None
    clock_skew: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if not self.allowed_topic_arns or isinstance(self.allowed_topic_arns, str):
            raise ValueError("allowed_topic_arns must be a non-empty set of ARNs")
        if not self.signature_versions <= set(_HASHES):
            raise ValueError(f"signature_versions must be a subset of {sorted(_HASHES)}")
        if self.max_age is not None and self.max_age <= SNS_MAX_RETRY_WINDOW:
            raise ValueError("max_age must exceed SNS's 3600 s retry window")

    @classmethod
    def for_local(cls, topic_arns: frozenset[str], authority: str) -> VerifierPolicy:
        """Local stack: certificates served over http from exactly `authority` (host:port)."""
        return cls(topic_arns, cert_host_pattern=re.escape(authority), allow_http=True)


class CertificateSource(Protocol):
    def get(self, url: str) -> bytes:
        """PEM bytes for `url`; raise CertificateUnavailable when it cannot be had."""


@dataclass(frozen=True)
class StaticCertificateSource:
    """Certificates known in advance (tests, the local stack)."""

    mapping: Mapping[str, bytes]

    def get(self, url: str) -> bytes:
        if url not in self.mapping:
            raise CertificateUnavailable(f"no certificate for {url}")
        return self.mapping[url]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect would take the fetch to a host the URL check never saw.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class HttpsCertificateSource:
    """Fetches certificates (blocking: run it off the event loop) and keeps the last few.

    SNS publishes a rotated key under a new URL, so a URL-keyed cache needs no expiry; the bound
    only stops a flood of distinct (allowed) URLs from growing memory. Failures are not cached.
    """

    def __init__(
        self, *, timeout: float = 5.0, max_entries: int = 32, allow_http: bool = False
    ) -> None:
        self.timeout = timeout
        self.allow_http = allow_http  # the local stack only
        self._cached_fetch = functools.lru_cache(maxsize=max_entries)(self._fetch)

    def get(self, url: str) -> bytes:
        return self._cached_fetch(url)

    def _fetch(self, url: str) -> bytes:
        if not (url.startswith("https://") or (self.allow_http and url.startswith("http://"))):
            raise CertificateUnavailable(f"refusing to fetch {url[:200]}")
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(url, timeout=self.timeout) as response:
                if response.status != 200:
                    raise CertificateUnavailable(f"HTTP {response.status} for {url}")
                pem: bytes = response.read(_MAX_CERT_BYTES + 1)
            if len(pem) > _MAX_CERT_BYTES:
                raise CertificateUnavailable(f"certificate at {url} is too large")
            x509.load_pem_x509_certificate(pem)  # never cache an error page
        except (OSError, http.client.HTTPException, ValueError) as e:  # URLError is an OSError
            raise CertificateUnavailable(f"cannot fetch {url}: {e}") from e
        return pem


@dataclass(frozen=True)
class SigningKey:
    """A certificate's RSA public key and validity window, parsed once per certificate."""

    key: rsa.RSAPublicKey
    not_before: datetime
    not_after: datetime

    @classmethod
    def from_pem(cls, pem: bytes) -> SigningKey:
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError as e:
            raise SnsRejected("bad_certificate", "unparseable PEM") from e
        key = cert.public_key()
        if not isinstance(key, rsa.RSAPublicKey):
            raise SnsRejected("bad_certificate", "not an RSA key")
        return cls(key, cert.not_valid_before_utc, cert.not_valid_after_utc)


_PADDING = padding.PKCS1v15()
_ALGORITHMS = {version: algorithm() for version, algorithm in _HASHES.items()}


class SnsVerifier:
    """Checks policy, then the RSA signature, of a parsed message.

    What does not change between messages is worked out once per certificate URL and kept: the
    URL's verdict (the policy is fixed) and the certificate's parsed public key and validity
    window, so the source is asked once per URL (SNS publishes a rotated key under a new URL).
    Bounded: URLs must be SNS hosts, but there are many of those. A failure is never kept.
    """

    def __init__(
        self, policy: VerifierPolicy, certs: CertificateSource, *, max_entries: int = 32
    ) -> None:
        self.policy = policy
        self.certs = certs
        self.max_entries = max_entries
        self._keys: dict[str, SigningKey] = {}  # by SigningCertURL, oldest first

    def verify(self, msg: SnsMessage, *, now: datetime) -> None:
        """Return if `msg` is authentic and ours; raise SnsRejected otherwise. `now` is aware."""
        p = self.policy
        if msg.signature_version not in p.signature_versions:
            raise SnsRejected("unsupported_signature_version", msg.signature_version)
        if msg.topic_arn not in p.allowed_topic_arns:
            raise SnsRejected("topic_not_allowed", msg.topic_arn)
        hosts, http_ok = p.cert_host_pattern, p.allow_http
        signing = self._keys.get(msg.signing_cert_url)  # present: its URL passed the check
        if signing is None:
            check_cert_url(msg.signing_cert_url, allowed_host_pattern=hosts, allow_http=http_ok)
        if msg.type != "Notification":  # a missing SubscribeURL ("") is refused too
            check_subscribe_url(
                msg.subscribe_url or "", allowed_host_pattern=hosts, allow_http=http_ok
            )
        if p.max_age is not None and not (-p.clock_skew <= now - msg.published_at <= p.max_age):
            raise SnsRejected("stale", msg.timestamp)
        try:
            signature = base64.b64decode(msg.signature, validate=True)
        except binascii.Error as e:
            raise SnsRejected("bad_signature", "not base64") from e
        if signing is None:
            signing = self._load_key(msg.signing_cert_url)
        if not signing.not_before <= now <= signing.not_after:
            raise SnsRejected("cert_expired", str(signing.not_after))
        try:
            signing.key.verify(
                signature, string_to_sign(msg), _PADDING, _ALGORITHMS[msg.signature_version]
            )
        except InvalidSignature as e:
            raise SnsRejected("bad_signature") from e

    def _load_key(self, url: str) -> SigningKey:
        signing = SigningKey.from_pem(self.certs.get(url))
        self._keys[url] = signing
        while len(self._keys) > self.max_entries:
            del self._keys[next(iter(self._keys))]  # the oldest
        return signing
