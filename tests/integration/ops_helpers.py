"""Helpers for the operations tests: run the real CLI with a test's settings, read offsets."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from flashsend.cli.entry import main
from flashsend.settings import Settings, settings_env


def cli(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *argv: str,
) -> tuple[int, str]:
    """`flashsend ARGV` in-process with FLASHSEND_* set from `settings`: (exit code, stdout)."""
    with monkeypatch.context() as m:
        for key, value in settings_env(settings).items():
            m.setenv(key, value)
        capsys.readouterr()
        code = main(list(argv))
        return code, capsys.readouterr().out


def last_json(out: str) -> Any:
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))


def stored_offsets(settings: Settings, group_id: str, topic: str) -> dict[int, int]:
    with psycopg.connect(settings.pg_dsn) as conn:
        rows = conn.execute(
            "SELECT partition, next_offset FROM kafka_offsets WHERE group_id = %s AND topic = %s",
            (group_id, topic),
        ).fetchall()
    return {int(p): int(o) for p, o in rows}


def set_offsets(settings: Settings, group_id: str, topic: str, offsets: dict[int, int]) -> None:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        for partition, offset in offsets.items():
            conn.execute(
                "INSERT INTO kafka_offsets (group_id, topic, partition, next_offset) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (group_id, topic, partition) "
                "DO UPDATE SET next_offset = excluded.next_offset",
                (group_id, topic, partition, offset),
            )


def broker_committed(settings: Settings, group: str, topic: str, partition: int) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        [tp] = consumer.committed([TopicPartition(topic, partition)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def high_watermarks(settings: Settings, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"hw-{uuid.uuid4().hex[:8]}"}
    )
    try:
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
            for p in range(partitions)
        }
    finally:
        consumer.close()


def audit_rows(settings: Settings, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(settings.pg_dsn) as conn:
        cur = conn.execute(f"SELECT * FROM {table} ORDER BY id")
        assert cur.description is not None
        names = [c.name for c in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
