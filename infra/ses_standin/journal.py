"""Durable record of accepted messages: an append-only JSON-lines file.

One line per accepted message, written as ASCII (`json.dumps` escapes everything else), so a
line's length in characters is its length in bytes and offsets can be computed without
encoding twice. Each call's lines go out in one write followed by a flush; the OS page cache
is durable enough for a test double (no fsync). A torn last line (the process died mid-write)
is cut off when the journal is reopened.

The lines are the bytes of `json.dumps(record, separators=(",", ":"))`, but written by
`LineEncoder`: one line per accepted message makes this the stand-in's hottest code, and
`json.dumps` took ~6 µs a line against ~2 µs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Record = dict[str, Any]

# The journal's file in the stand-in's state directory (`flashsend up` sizes its wait by it).
JOURNAL_FILE = "messages.jsonl"

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode
# json's own C function: a str as a JSON string literal with non-ASCII escaped (TypeError
# for anything but a str, so a value of an unexpected type fails loudly, never silently).
_quote: Any = encode_basestring_ascii


class LineEncoder:
    """Journal lines of one send call: `json.dumps(record, separators=(",", ":"))`, by hand.

    The fields every record of a call shares (time, operation, sender, template,
    configuration set) are encoded once per call; per record only its own strings are
    quoted. The keys come in `account._record`'s order; a test compares the bytes with
    `json.dumps` of the same records.
    """

    def __init__(
        self,
        now: float,
        operation: str,
        sender: str,
        template: str | None,
        configuration_set: str | None,
    ) -> None:
        self._head = (
            f',"time":{_dumps(now)},"operation":{_quote(operation)},"from":{_quote(sender)}'
        )
        self._template = ',"template":' + _nullable(template) + ',"subject":'
        self._tail = ',"configuration_set":' + _nullable(configuration_set)

    def line(self, record: Record) -> str:
        """`record`'s line; it must hold the fields this encoder was made with."""
        copies = ""
        if "cc" in record:
            copies += ',"cc":' + _list(record["cc"])
        if "bcc" in record:
            copies += ',"bcc":' + _list(record["bcc"])
        return (
            f'{{"message_id":{_quote(record["message_id"])}{self._head}'
            f',"destination":{_list(record["destination"])}{copies}'
            f"{self._template}{_nullable(record['subject'])}"
            f',"headers":{_dict(record["headers"])},"tags":{_dict(record["tags"])}'
            f'{self._tail},"rendering_failure":{_nullable(record["rendering_failure"])}'
            + (f',"promo_code":{_quote(record["promo_code"])}}}' if "promo_code" in record else "}")
        )


def _nullable(value: str | None) -> str:
    return "null" if value is None else _quote(value)


def _list(values: list[str]) -> str:
    return "[" + ",".join([_quote(value) for value in values]) + "]"


def _dict(values: dict[str, str]) -> str:
    return "{" + ",".join([_quote(k) + ":" + _quote(v) for k, v in values.items()]) + "}"


class Journal:
    """`messages.jsonl` in the state directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
        self._size = _cut_torn_tail(path)
        self._writer = path.open("a", encoding="ascii", newline="\n")
        self._reader = path.open("rb")

    @property
    def size(self) -> int:
        return self._size

    def replay(self) -> Iterator[tuple[int, Record]]:
        """Every stored record with its byte offset, oldest first (skips corrupt lines)."""
        offset = 0
        with self.path.open("rb") as fh:
            for number, line in enumerate(fh, start=1):
                start = offset
                offset += len(line)
                if start >= self._size:
                    break
                try:
                    record = json.loads(line)
                except ValueError:
                    log.warning("journal_corrupt_line path=%s line=%d", self.path, number)
                    continue
                if isinstance(record, dict):
                    yield start, record

    def append(self, lines: list[str]) -> list[int]:
        """Write one call's lines (ASCII JSON, no newlines) and return their offsets."""
        offsets: list[int] = []
        position = self._size
        for line in lines:
            offsets.append(position)
            position += len(line) + 1
        self._writer.write("\n".join(lines) + "\n")
        self._writer.flush()
        self._size = position
        return offsets

    def read(self, offsets: Iterable[int]) -> list[Record]:
        """Records stored at the given offsets."""
        records: list[Record] = []
        for offset in offsets:
            self._reader.seek(offset)
            records.append(json.loads(self._reader.readline()))
        return records

    def clear(self) -> None:
        self._writer.truncate(0)
        self._writer.seek(0)
        self._size = 0

    def close(self) -> None:
        self._writer.close()
        self._reader.close()


def _cut_torn_tail(path: Path) -> int:
    """Truncate an unterminated last line; return the resulting size."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return size
        block = 1 << 16
        end = size
        while end > 0:
            start = max(0, end - block)
            fh.seek(start)
            chunk = fh.read(end - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        else:
            keep = 0
        log.warning("journal_torn_tail path=%s cut_bytes=%d", path, size - keep)
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
        return keep
