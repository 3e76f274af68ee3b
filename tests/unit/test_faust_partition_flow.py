"""The sender's fetch control on the installed Faust (streams.app.FaustPartitionFlow).

Faust's `getmany` yields a fetched record only if its partition is active or in the
consumer's `_buffered_partitions`. A partition paused with `pause_partitions` while its
records are being iterated loses them (every partition lost its last doorbells in a 400k
bench); one taken out with `on_buffer_full`, as FaustPartitionFlow does, keeps them. These
tests pin that contract, so a Faust upgrade that changes it fails here, not in production.
"""

from __future__ import annotations

from faust.types import TP

from flashsend.settings import load_settings
from streams.app import FaustPartitionFlow, create_app


def _flow() -> tuple[FaustPartitionFlow, TP]:
    settings = load_settings()
    app = create_app(settings)
    flow = app.runtime.flow
    assert isinstance(flow, FaustPartitionFlow)
    return flow, TP(settings.topic_recipients, 3)


def test_a_paused_partition_leaves_the_fetch_but_its_fetched_records_still_pass() -> None:
    flow, tp = _flow()
    consumer = flow.app.consumer
    flow.pause({3})
    assert tp not in consumer._get_active_partitions()  # not fetched any more
    assert tp in consumer._buffered_partitions  # getmany still yields what was fetched


def test_a_resumed_partition_is_fetched_again() -> None:
    flow, tp = _flow()
    consumer = flow.app.consumer
    flow.pause({3})
    flow.resume({3})
    assert tp in consumer._get_active_partitions()
    assert tp not in consumer._buffered_partitions


def test_pause_partitions_is_the_trap_the_flow_avoids() -> None:
    flow, tp = _flow()
    consumer = flow.app.consumer
    consumer.pause_partitions({tp})
    assert tp not in consumer._get_active_partitions()
    assert tp not in consumer._buffered_partitions  # its fetched records would be dropped
