"""Where each worker role's lag can be read, for autoscalers (deploy/kubernetes/autoscaling/).

A role's Kafka consumer group is its Faust app id; the offset it resumes from is the one stored
in PostgreSQL (sinks.offsets, streams.faust_offsets) under its store group, and each worker
exports `log end - stored offset` per partition as `flashsend_consumer_lag{group, topic,
partition}` (sinks.metrics_state.lag_reader). What the broker knows differs per role:

- campaign and mail workers consume through Faust's stream, whose acks commit to the broker
  (every 1,000 / 100 records or 5 s: faust_offsets.app_options); the broker's lag of their
  group trails the stored offset by that much and is a usable scaling signal;
- the feedback worker reads batches outside Faust's stream and acks nothing: its group's
  broker offsets never advance, so the broker's lag of that group only grows. Its lag is the
  exported metric, and nothing else.

tests/unit/test_deploy_manifests.py holds the scaling objects to these names.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashsend import deliverability
from flashsend.settings import Settings

LAG_METRIC = "flashsend_consumer_lag"  # metrics_state.lag_reader's gauge


@dataclass(frozen=True)
class LagSource:
    kafka_group: str  # the consumer group at the broker (the Faust app id)
    store_group: str  # the `group` label of LAG_METRIC (offsets stored in PostgreSQL)
    topic: str
    commits_to_broker: bool  # whether the broker's lag of kafka_group tracks the work
    partitions: int  # of `topic`: the most workers of the role that get work


def lag_sources(settings: Settings) -> dict[str, LagSource]:
    """Per worker role (`flashsend worker --role …`)."""
    s = settings
    return {
        "campaign": LagSource(s.app_id, s.group_sender, s.topic_recipients, True, s.partitions),
        "mail": LagSource(
            s.mail_app_id, s.group_mail, s.topic_order_events, True, s.order_events_partitions
        ),
        "feedback": LagSource(
            deliverability.feedback_app_id(s),
            deliverability.feedback_app_id(s),
            s.topic_mail_events,
            False,
            s.order_events_partitions,
        ),
    }
