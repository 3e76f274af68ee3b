"""The local broker's cluster id never looks like an option to Kafka's storage tool."""

from __future__ import annotations

import base64

from infra.kafka import new_cluster_id


def test_cluster_ids_are_kafka_uuids_that_never_start_with_a_dash() -> None:
    ids = [new_cluster_id() for _ in range(5_000)]  # ~78 of 5,000 raw draws start with '-'
    assert not any(i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
