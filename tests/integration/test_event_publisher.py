"""EventPublisher against the real broker: calls made in one loop pass are produced together,
and each call still answers for its own records only."""

from __future__ import annotations

import asyncio

import pytest

from flashsend.settings import Settings
from producers.event_publisher import EventPublisher, OutRecord, PublishFailed
from producers.mail_topics import ensure_mail_topics
from tests.integration.feedback_helpers import read_all


def records(tag: str, n: int) -> list[OutRecord]:
    return [OutRecord(f"{tag}-{i}".encode(), f"v{i}".encode(), [("n", str(i))]) for i in range(n)]


def test_concurrent_calls_each_return_after_their_own_acks(settings: Settings) -> None:
    ensure_mail_topics(settings, timeout=30.0)

    async def main() -> list[BaseException | None]:
        publisher = EventPublisher(settings.kafka_bootstrap, settings.topic_mail_events)
        calls = [publisher.publish(records(f"c{c}", 1 + c % 3)) for c in range(40)]
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
        assert publisher.published == sum(1 + c % 3 for c in range(40))
        await asyncio.to_thread(publisher.close, 5.0)
        return results

    assert asyncio.run(main()) == [None] * 40
    keys = [m.key() for m in read_all(settings, settings.topic_mail_events, expect=80)]
    assert sorted(keys) == sorted(r.key for c in range(40) for r in records(f"c{c}", 1 + c % 3))


def test_a_refused_produce_fails_only_its_call_and_the_rest_of_the_pass_goes_on(
    settings: Settings,
) -> None:
    """The local queue holds 5: in one pass, call 1 (3 records) fits, call 2 gets 2 of its 3
    in and fails, call 3 gets none in and fails; calls in the next pass work again."""
    ensure_mail_topics(settings, timeout=30.0)

    async def main() -> None:
        publisher = EventPublisher(
            settings.kafka_bootstrap, settings.topic_mail_events, max_queued=5
        )
        first, second, third = await asyncio.wait_for(
            asyncio.gather(
                publisher.publish(records("a", 3)),
                publisher.publish(records("b", 3)),
                publisher.publish(records("c", 3)),
                return_exceptions=True,
            ),
            30,
        )
        assert first is None
        assert isinstance(second, PublishFailed) and "produce" in str(second)
        assert isinstance(third, PublishFailed) and "produce" in str(third)
        await asyncio.wait_for(publisher.publish(records("d", 2)), 30)
        assert publisher.published == 5
        await asyncio.to_thread(publisher.close, 5.0)

    asyncio.run(main())


@pytest.mark.parametrize("empty", [[]])
def test_an_empty_call_returns_at_once(settings: Settings, empty: list[OutRecord]) -> None:
    async def main() -> None:
        publisher = EventPublisher(settings.kafka_bootstrap, settings.topic_mail_events)
        await asyncio.wait_for(publisher.publish(empty), 1)
        assert publisher.published == 0

    asyncio.run(main())


def test_renewing_fails_what_the_old_producer_holds_and_publishes_with_a_new_one(
    settings: Settings,
) -> None:
    """The SQS puller renews its producer once the broker answers again after an outage: a
    call still waiting on the old producer fails at once (its event is retried), and the
    next call goes through the new one."""
    ensure_mail_topics(settings, timeout=30.0)

    async def main() -> None:
        # Nothing listens on port 1: the record waits in the producer until its 30-s timeout.
        stuck = EventPublisher("127.0.0.1:1", settings.topic_mail_events, timeout_s=30.0)
        waiting = asyncio.ensure_future(stuck.publish(records("stuck", 1)))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        stuck.renew()
        with pytest.raises(PublishFailed, match="urge"):
            await asyncio.wait_for(waiting, 2.0)  # not the 30-s timeout

        publisher = EventPublisher(settings.kafka_bootstrap, settings.topic_mail_events)
        await asyncio.wait_for(publisher.publish(records("before", 1)), 30)
        publisher.renew()
        await asyncio.wait_for(publisher.publish(records("after", 2)), 30)
        assert publisher.published == 3
        await asyncio.to_thread(publisher.close, 5.0)

    asyncio.run(main())


def test_calls_failing_for_a_while_get_a_new_producer_and_a_working_one_keeps_its_own(
    settings: Settings,
) -> None:
    """The webhook has no gate to tell it the broker is back: its publisher renews itself
    once calls have failed `renew_after_s` in a row, at most that often."""
    ensure_mail_topics(settings, timeout=30.0)

    async def main() -> None:
        failing = EventPublisher(
            "127.0.0.1:1", settings.topic_mail_events, timeout_s=0.2, renew_after_s=1.0
        )
        began = asyncio.get_running_loop().time()
        failures = 0
        while asyncio.get_running_loop().time() - began < 2.6:
            with pytest.raises(PublishFailed):
                await asyncio.wait_for(failing.publish(records("down", 1)), 5.0)
            failures += 1
        assert failures >= 3
        assert 1 <= failing.renewals <= 2, (failing.renewals, failures)

        working = EventPublisher(
            settings.kafka_bootstrap, settings.topic_mail_events, renew_after_s=0.0
        )
        for i in range(3):
            await asyncio.wait_for(working.publish(records(f"up{i}", 1)), 30)
        assert working.renewals == 0 and working.published == 3
        await asyncio.to_thread(working.close, 5.0)

    asyncio.run(main())
