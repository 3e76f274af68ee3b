"""Deliverability settings: who the webhook trusts, the unsubscribe headers, the key guard."""

from __future__ import annotations

import pytest

from flashsend import deliverability
from flashsend.lab.feedback_bench import bench_processes
from flashsend.settings import LOCAL_FIREHOSE_ACCESS_KEY, Settings, load_settings
from producers.sns_verify import AWS_SNS_HOST_PATTERN
from producers.unsubscribe_endpoint import _is_one_click
from sinks.recipient_store import ClaimedRecipient
from streams.rules.unsubscribe_token import read_token

KEYS = (
    "k2:c2Vjb25kLXNlY3JldC1vZi0zMi1ieXRlcy4uLi4uLi4=,"
    "k1:Zmlyc3Qtc2VjcmV0LW9mLTMyLWJ5dGVzLi4uLi4uLi4="
)


def settings(**overrides: object) -> Settings:
    return load_settings(**{"ses_port": 4566, "webhook_port": 4567, **overrides})


def test_local_stack_trusts_only_the_stand_in_over_http() -> None:
    s = settings()
    policy = deliverability.verifier_policy(s)
    assert policy.allow_http and policy.cert_host_pattern == r"127\.0\.0\.1:4566"
    assert policy.allowed_topic_arns == frozenset(s.sns_topic_arns)


def test_real_ses_trusts_only_aws_over_https() -> None:
    s = settings(ses_endpoint="", unsubscribe_keys=KEYS)
    policy = deliverability.verifier_policy(s)
    assert not policy.allow_http and policy.cert_host_pattern == AWS_SNS_HOST_PATTERN
    assert not deliverability.certificate_source(s).allow_http


def test_the_local_key_is_refused_with_real_ses() -> None:
    with pytest.raises(deliverability.DeliverabilityConfigError):
        deliverability.token_keys(settings(ses_endpoint=""))
    assert (
        deliverability.token_keys(settings(ses_endpoint="", unsubscribe_keys=KEYS)).current_kid
        == "k2"
    )


def test_the_local_firehose_key_is_refused_with_real_ses() -> None:
    local = settings()
    assert deliverability.firehose_access_keys(local) == (LOCAL_FIREHOSE_ACCESS_KEY,)
    with pytest.raises(deliverability.DeliverabilityConfigError, match="FIREHOSE_ACCESS_KEYS"):
        deliverability.firehose_access_keys(settings(ses_endpoint=""))
    real = settings(ses_endpoint="", firehose_access_keys="s3cret, next")
    assert deliverability.firehose_access_keys(real) == ("s3cret", "next")


def test_headers_carry_a_token_for_user_and_campaign() -> None:
    s = settings(webhook_public_url="https://mail.example.org/", unsubscribe_keys=KEYS)
    headers = deliverability.unsubscribe_headers(s)(ClaimedRecipient(42, 7, 1234, "a@x.test", None))
    url = headers["List-Unsubscribe"]
    assert url.startswith("<https://mail.example.org/u/") and url.endswith(">")
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    claim = read_token(deliverability.token_keys(s), url[1:-1].rsplit("/", 1)[1])
    assert claim is not None and (claim.user_id, claim.campaign_id, claim.kid) == (1234, 42, "k2")


def test_http_links_only_on_the_local_stack() -> None:
    assert deliverability.unsubscribe_headers(settings())(
        ClaimedRecipient(1, 1, 1, "a@x.test", None)
    )
    real = settings(ses_endpoint="", unsubscribe_keys=KEYS, webhook_public_url="http://x.test")
    with pytest.raises(ValueError):
        deliverability.unsubscribe_headers(real)


def test_marketing_and_transactional_need_their_own_configuration_sets() -> None:
    deliverability.check_separation(settings())
    with pytest.raises(deliverability.DeliverabilityConfigError):
        deliverability.check_separation(settings(transactional_configuration_set="marketing"))


@pytest.mark.parametrize(
    ("content_type", "body", "ok"),
    [
        ("application/x-www-form-urlencoded", b"List-Unsubscribe=One-Click", True),
        ("text/plain", b"List-Unsubscribe=One-Click", True),
        ("application/x-www-form-urlencoded", b"List-Unsubscribe=One-Click&x=1", True),
        ("application/x-www-form-urlencoded", b"List-Unsubscribe=one-click", False),
        ("application/x-www-form-urlencoded", b"", False),
        (
            "multipart/form-data",
            b'--b\r\nContent-Disposition: form-data; name="List-Unsubscribe"\r\n\r\nOne-Click\r\n',
            True,
        ),
    ],
)
def test_one_click_body(content_type: str, body: bytes, ok: bool) -> None:
    assert _is_one_click(content_type, body) is ok


def test_event_destinations_publish_what_the_agents_use_and_no_engagement_by_default() -> None:
    s = settings()
    assert set(deliverability.event_types(s)) == {
        "Delivery",
        "Bounce",
        "Complaint",
        "Reject",
        "DeliveryDelay",
        "Rendering Failure",
    }
    assert "OPEN" not in deliverability.matching_event_types(s)
    assert "CLICK" not in deliverability.matching_event_types(s)
    assert "SEND" not in deliverability.matching_event_types(s)  # would double every campaign's
    assert "RENDERING_FAILURE" in deliverability.matching_event_types(s)
    engaged = settings(ses_event_types=("Delivery", "Open", "Click"))
    assert deliverability.matching_event_types(engaged) == ["DELIVERY", "OPEN", "CLICK"]
    for bad in (("Delivery", "Opened"), ()):
        with pytest.raises(deliverability.DeliverabilityConfigError, match="SES_EVENT_TYPES"):
            deliverability.event_types(settings(ses_event_types=bad))


def test_webhook_processes_default_to_half_the_cpus() -> None:
    auto = settings(webhook_processes=0)
    assert [deliverability.webhook_processes(auto, cpus=n) for n in (1, 2, 3, 8)] == [1, 1, 1, 4]
    assert deliverability.webhook_processes(settings(webhook_processes=3), cpus=2) == 3
    with pytest.raises(deliverability.DeliverabilityConfigError, match="WEBHOOK_PROCESSES"):
        deliverability.webhook_processes(settings(webhook_processes=-1))


def test_feedback_bench_runs_one_webhook_process_per_cpu_unless_set() -> None:
    # The bench measures what the path takes in with nothing else running: every CPU.
    auto = settings(webhook_processes=0)
    assert [bench_processes(auto, cpus=n) for n in (1, 2, 8)] == [1, 2, 8]
    assert bench_processes(settings(webhook_processes=3), cpus=2) == 3
    with pytest.raises(deliverability.DeliverabilityConfigError, match="WEBHOOK_PROCESSES"):
        bench_processes(settings(webhook_processes=-1))
