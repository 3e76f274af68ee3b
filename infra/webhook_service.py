"""The webhook as a service of the local stack (`flashsend up`), like the SES stand-in.

Started as `flashsend webhook` with the stack's settings; once it answers, it is subscribed to
the stand-in's event topic for the marketing, transactional and SMS configuration sets (what
an SES or SMS event destination + SNS subscription are in AWS), the origination number's
two-way SMS goes to the same topic, and `up` waits for the webhook to have confirmed the
subscription, i.e. for the whole signed round trip to work.

With FLASHSEND_EVENTS_INGEST=firehose the SES configuration sets publish to a delivery stream
instead (made at the stand-in as `aws apply --path firehose` makes it): the SNS subscription
is then for the SMS configuration set only, so no SES event reaches the webhook twice.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from flashsend import deliverability
from flashsend.settings import Settings
from infra.aws_plan import SMS_EVENT_TYPES
from infra.command_service import CommandService
from infra.errors import StackError
from sinks.sms import make_sms_client


def subscribe_local(
    settings: Settings,
    *,
    endpoint: str | None = None,
    timeout: float = 20.0,
    ses_events: bool = True,
) -> dict[str, Any]:
    """Subscribe the webhook at the local stand-in and wait for its confirmation.

    Like an event destination, the subscription carries the configured event types: the
    stand-in builds, signs and POSTs nothing else (it never generates Open or Click).
    Without `ses_events` only the SMS configuration set's events are subscribed to.
    """
    from infra.ses_standin.events_admin import SesEventsAdmin
    from infra.ses_standin.subscriptions import EVENT_TYPES

    if not settings.ses_endpoint_url:
        raise StackError("SES is real Amazon SES: subscribe the webhook with SNS instead")
    admin = SesEventsAdmin(settings.ses_endpoint_url)
    target = endpoint or deliverability.public_url(settings) + deliverability.SNS_PATH
    ses_sets = (settings.marketing_configuration_set, settings.transactional_configuration_set)
    sets = [s for s in (*(ses_sets if ses_events else ()), settings.sms_configuration_set) if s]
    if not sets and not ses_events:
        raise StackError("no SMS configuration set to subscribe the webhook for")
    types = [t for t in deliverability.event_types(settings) if t in EVENT_TYPES]
    if not ses_events:
        types = []
    topic = settings.sns_topic_arns[0]
    sub = admin.subscribe(
        target, topic, configuration_sets=sets or None, event_types=[*types, *SMS_EVENT_TYPES]
    )
    try:
        confirmed = admin.wait_confirmed(sub["id"], timeout=timeout)
    except TimeoutError as exc:
        raise StackError(f"the webhook did not confirm its SNS subscription: {exc}") from exc
    # Replies to the origination number (two-way SMS) go to the same topic: STOP events.
    try:
        make_sms_client(settings, pool=1).update_phone_number(
            PhoneNumberId=settings.sms_origination_identity,
            TwoWayEnabled=True,
            TwoWayChannelArn=topic,
        )
    except (BotoCoreError, ClientError) as exc:
        raise StackError(f"could not turn two-way SMS on at the stand-in: {exc}") from exc
    return confirmed


class WebhookService(CommandService):
    command = "webhook"
    what = "the webhook"
    port_env = "FLASHSEND_WEBHOOK_PORT"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, settings.webhook_port)

    def after_ready(self) -> None:
        s = self.settings
        if s.ses_endpoint_url and "ses" in s.local_services:
            firehose = s.events_ingest == "firehose"
            if firehose:
                from infra.aws_apply import ensure_local_firehose

                ensure_local_firehose(s)
            if s.sms_configuration_set or not firehose:
                subscribe_local(s, ses_events=not firehose)
