"""A worker's offset seek outlives a PostgreSQL outage (streams/app.py Runtime.offsets).

Faust seeks every assigned partition to the offsets stored in PostgreSQL after each rebalance;
a failure there crashes the worker (Faust's recovery service), and the consumer thread then
reports on a loop that is already closed. An immediate PostgreSQL restart during a rebalance
did exactly that in `flashsend chaos`. Here the outage is the same for the worker's
connections: every backend of the test database is terminated and new ones are refused.
"""

from __future__ import annotations

import asyncio

import psycopg

from flashsend.settings import Settings
from sinks.offsets import Assignment
from streams.app import Runtime


def _database_outage(settings: Settings, allow: bool) -> None:
    with psycopg.connect(settings.pg_dsn_for("postgres"), autocommit=True) as conn:
        conn.execute(
            f'ALTER DATABASE "{settings.pg_database}" ALLOW_CONNECTIONS {str(allow).lower()}'
        )
        if not allow:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (settings.pg_database,),
            )


def test_offset_seek_waits_for_postgres_instead_of_failing(settings: Settings) -> None:
    async def scenario() -> dict[int, int]:
        runtime = Runtime(settings)
        try:
            await runtime.ensure_started()
            assert runtime.campaigns is not None
            # Nothing else may touch the pool: its connections must still be the dead ones
            # when the seek asks for one, as they are when a rebalance follows a restart.
            await runtime.campaigns.stop()
            await runtime.offsets(Assignment.of(settings.topic_recipients, [0, 1]))
            _database_outage(settings, allow=False)
            try:
                assignment = Assignment.of(settings.topic_recipients, [0, 1])
                seek = asyncio.create_task(runtime.offsets(assignment))
                await asyncio.sleep(2.0)
                assert not seek.done() or seek.exception() is None, seek.exception()
            finally:
                _database_outage(settings, allow=True)
            return dict(await asyncio.wait_for(seek, timeout=30))
        finally:
            await runtime.stop()

    assert asyncio.run(scenario()) == {0: 0, 1: 0}
