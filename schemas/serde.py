"""Avro serialisation in the Confluent wire format (magic byte 0 + 4-byte schema id + body).

Schemas are files in `schemas/avro/` named `<name>.v<N>.avsc`. The schema id comes from a
schema-registry client (confluent-kafka's). Encoding and decoding use fastavro directly with a
parsed schema cached per id: the hot path (a million records) costs a few microseconds each.
Decoding resolves the writer's schema (looked up by id) against our reader schema, so a
consumer accepts records written with the previous version of a contract.

With the in-process `mock://` registry every process registers all schema files in a fixed
order at start-up, so ids agree between the producer and worker processes. With a real
registry (`http://…`, e.g. the local Apicurio under `/apis/ccompat/v7`) each codec looks its
schema up and uses the registered id. Only on the local stack (`auto_register`, the setting
FLASHSEND_SCHEMA_AUTO_REGISTER: on for mock:// and loopback registries) may a codec register a
missing schema, creating its subject at the configured level (FULL) first; anywhere else a
missing schema stops the process with one line saying to run `flashsend schemas register`,
because a producer that registers at start would create subjects at the registry's global
level and publish contracts nobody reviewed.

A registry that does not answer is not the record's fault: `RegistryUnavailable`, never a
SerdeError, so no good record is dead-lettered during an outage. Consumers call
`wait_for_writer_schemas` before decoding a batch: it looks up, in a thread and with backoff,
every writer schema id the batch names that is not cached yet, until the registry answers.
Only an id the registry says it does not have (404) or a schema that cannot be parsed makes a
record poison (`unknown_schema_id`, `bad_writer_schema`); that answer is cached too.

Why not confluent-kafka's AvroSerializer/AvroDeserializer on the hot path: they produce the
same bytes (they use fastavro too; `tests/integration/test_schema_registry.py` proves both
directions against the real registry), but add a per-record subject-strategy call, a
registry-cache lookup and a dict round trip through `to_dict`/`from_dict`. A campaign decodes a
million doorbells; the codec below keeps that to a few microseconds each.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import random
import re
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from flashsend.errors import FlashsendError
from flashsend.settings import Settings
from streams.rules.backoff import backoff_delay

SCHEMA_DIR = Path(__file__).parent / "avro"
_FILE = re.compile(r"^(?P<name>[a-z_]+)\.v(?P<version>\d+)\.avsc$")
_HEADER = struct.Struct(">bI")
MAGIC = 0


class ContractNotRegistered(FlashsendError):
    """A contract's schema is not in the registry and this process may not register it."""


class SerdeError(Exception):
    """A record could not be decoded; `reason` is short and goes into dead-letter headers."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class RegistryUnavailable(Exception):
    """The schema registry did not answer (down, timed out, 5xx): retry, the record is fine."""


log = logging.getLogger("flashsend.serde")


@dataclass(frozen=True)
class SchemaFile:
    name: str
    version: int
    path: Path

    @property
    def subject(self) -> str:
        """Subject in the registry (record-name strategy: one subject per contract)."""
        return f"flashsend.{self.name}-value"

    def text(self) -> str:
        return self.path.read_text()


def schema_files(directory: Path = SCHEMA_DIR) -> list[SchemaFile]:
    found = []
    for path in sorted(directory.glob("*.avsc")):
        match = _FILE.match(path.name)
        if match is None:
            raise ValueError(f"schema file must be named <name>.v<N>.avsc: {path.name}")
        found.append(SchemaFile(match["name"], int(match["version"]), path))
    return sorted(found, key=lambda f: (f.name, f.version))


def latest(name: str, directory: Path = SCHEMA_DIR) -> SchemaFile:
    versions = [f for f in schema_files(directory) if f.name == name]
    if not versions:
        raise KeyError(f"no schema named {name} in {directory}")
    return versions[-1]


_clients: dict[str, SchemaRegistryClient] = {}
_clients_lock = threading.Lock()


def registry_client(url: str) -> SchemaRegistryClient:
    """One client per URL per process. A mock registry gets every schema file registered in
    a fixed order, so every process computes the same ids."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = SchemaRegistryClient.new_client({"url": url})
            if url.startswith("mock://"):
                for f in schema_files():
                    client.register_schema(f.subject, Schema(f.text(), "AVRO"))
            _clients[url] = client
        return client


def codec(settings: Settings, name: str) -> AvroCodec:
    """The codec of contract `name` for this process's registry and registration policy."""
    return AvroCodec(
        registry_client(settings.schema_registry_url),
        name,
        auto_register=bool(settings.schema_auto_register),
        compatibility=settings.schema_compatibility,
    )


def check_registered(settings: Settings, names: tuple[str, ...]) -> None:
    """At a process's start, before it joins anything: each contract it reads or writes has
    an id (or may be registered here). Raises ContractNotRegistered, one line for the CLI,
    instead of an agent crashing later with a traceback."""
    for name in names:
        try:
            codec(settings, name)
        except FlashsendError:
            raise
        except Exception as exc:  # httpx transport errors, timeouts: the registry is away
            raise FlashsendError(
                f"the schema registry at {settings.schema_registry_url} does not answer "
                f"({type(exc).__name__}: {exc}): start the local stack with `flashsend up`, or "
                "point FLASHSEND_SCHEMA_REGISTRY_URL at your registry"
            ) from exc


def _missing(exc: SchemaRegistryError) -> bool:
    return exc.http_status_code == 404


def _set_level_once(registry: SchemaRegistryClient, subject: str, level: str) -> None:
    """Set a new subject's level. Workers starting together on a fresh registry race here:
    the registry refuses the second rule with 409; the winner's level is kept if it is ours."""
    try:
        registry.set_compatibility(subject, level)
    except SchemaRegistryError as exc:
        if exc.http_status_code != 409:
            raise
        found = registry.get_compatibility(subject)
        if found != level:
            raise FlashsendError(
                f"schema registry: {subject} is at {found}, not the configured {level}: "
                "set FLASHSEND_SCHEMA_COMPATIBILITY to match or change the subject's level"
            ) from exc


def schema_id(
    registry: SchemaRegistryClient, file: SchemaFile, auto_register: bool, compatibility: str
) -> int:
    """The registered id of `file`'s schema under its subject. Registers it only with
    `auto_register`, a new subject at `compatibility` first; else raises ContractNotRegistered."""
    schema = Schema(file.text(), "AVRO")
    try:
        try:
            return int(registry.lookup_schema(file.subject, schema).schema_id)  # type: ignore[arg-type]
        except SchemaRegistryError as exc:
            if not _missing(exc):
                raise
        if not auto_register:
            raise ContractNotRegistered(
                f"{file.path.name} is not registered under subject {file.subject}: run "
                "`flashsend schemas register` (it sets each subject's level, then registers "
                "every version); outside the local stack nothing registers at start"
            )
        if type(registry).__name__ != "MockSchemaRegistryClient":  # mock://: no levels
            try:
                registry.get_latest_version(file.subject)
            except SchemaRegistryError as exc:
                if not _missing(exc):
                    raise
                _set_level_once(registry, file.subject, compatibility)
        registered = registry.register_schema_full_response(file.subject, schema)
        return int(registered.schema_id)  # type: ignore[arg-type]
    except SchemaRegistryError as exc:
        raise FlashsendError(f"schema registry: {file.subject}: {exc}") from exc


class AvroCodec:
    """Encoder/decoder for one contract (the latest schema file of `name`)."""

    def __init__(
        self,
        registry: SchemaRegistryClient,
        name: str,
        directory: Path = SCHEMA_DIR,
        *,
        auto_register: bool = False,
        compatibility: str = "FULL",
    ) -> None:
        self._registry = registry
        self.file = latest(name, directory)
        self._schema_json = json.loads(self.file.text())
        self._reader = fastavro.parse_schema(self._schema_json)
        self.schema_id: int = schema_id(registry, self.file, auto_register, compatibility)
        self._header = _HEADER.pack(MAGIC, self.schema_id)
        self._writers: dict[int, Any] = {self.schema_id: self._reader}
        self._unusable: dict[int, SerdeError] = {}  # ids the registry answered about: poison
        self._lock = threading.Lock()

    @property
    def header(self) -> bytes:
        """The wire-format header (magic byte + schema id) this codec writes."""
        return self._header

    @property
    def schema(self) -> dict[str, Any]:
        """The schema this codec writes (parsed JSON of the latest schema file)."""
        return dict(self._schema_json)

    def encode(self, record: dict[str, Any]) -> bytes:
        buf = io.BytesIO()
        buf.write(self._header)
        fastavro.schemaless_writer(buf, self._reader, record)
        return buf.getvalue()

    def decode(self, data: bytes | None) -> dict[str, Any]:
        if not data or len(data) < _HEADER.size:
            raise SerdeError("not_avro", "empty or shorter than the wire-format header")
        magic, schema_id = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise SerdeError("not_avro", f"magic byte {magic}")
        writer = self._writer_schema(schema_id)
        try:
            record = fastavro.schemaless_reader(
                io.BytesIO(memoryview(data)[_HEADER.size :]), writer, self._reader
            )
        except Exception as exc:  # fastavro raises many types on garbage
            raise SerdeError("bad_avro_body", f"{type(exc).__name__}: {exc}") from None
        if not isinstance(record, dict):
            raise SerdeError("bad_avro_body", "not a record")
        return record

    def missing_writer_ids(self, values: Iterable[bytes | None]) -> set[int]:
        """Writer schema ids named by `values` that are neither cached nor known poison."""
        missing: set[int] = set()
        for data in values:
            if not data or len(data) < _HEADER.size:
                continue
            magic, schema_id = _HEADER.unpack_from(data)
            known = schema_id in self._writers or schema_id in self._unusable
            if magic == MAGIC and not known:
                missing.add(schema_id)
        return missing

    def load_writer(self, schema_id: int) -> None:
        """Fetch and cache one writer schema; an id the registry does not have is cached as
        poison (decoding its records dead-letters them). Raises RegistryUnavailable."""
        with contextlib.suppress(SerdeError):
            self._writer_schema(schema_id)

    def _writer_schema(self, schema_id: int) -> Any:
        writer = self._writers.get(schema_id)
        if writer is not None:
            return writer
        known = self._unusable.get(schema_id)
        if known is not None:
            raise known
        with self._lock:
            try:
                schema = self._registry.get_schema(schema_id)
            except SchemaRegistryError as exc:
                if exc.http_status_code != 404:
                    raise RegistryUnavailable(f"schema {schema_id}: {exc}") from None
                return self._poison(schema_id, "unknown_schema_id", str(exc))
            except Exception as exc:  # httpx transport errors, timeouts: the registry is away
                raise RegistryUnavailable(f"schema {schema_id}: {exc}") from None
            try:
                writer = fastavro.parse_schema(json.loads(schema.schema_str or ""))
            except Exception as exc:
                return self._poison(schema_id, "bad_writer_schema", str(exc))
            self._writers[schema_id] = writer
            return writer

    def _poison(self, schema_id: int, reason: str, detail: str) -> Any:
        error = SerdeError(reason, f"{schema_id}: {detail}"[:500])
        self._unusable[schema_id] = error
        raise error


async def wait_for_writer_schemas(
    codecs: Iterable[AvroCodec],
    values: list[bytes | None],
    *,
    cap_s: float = 5.0,
    rng: random.Random | None = None,
) -> int:
    """Look up the writer schemas `values` name that a codec has not cached, in a thread,
    retrying with backoff and jitter while the registry does not answer. Returns the retries.
    Afterwards decoding those values asks the registry nothing (a 404 is cached as poison)."""
    rng = rng or random.Random()
    retries = 0
    for codec in codecs:
        for schema_id in sorted(codec.missing_writer_ids(values)):
            while True:
                try:
                    await asyncio.to_thread(codec.load_writer, schema_id)
                    break
                except RegistryUnavailable as exc:
                    retries += 1
                    delay = backoff_delay(min(retries, 10), base=0.2, cap=cap_s, rng=rng)
                    log.warning(
                        "schema registry unavailable (attempt %d), retrying in %.2fs: %s",
                        retries,
                        delay,
                        exc,
                    )
                    await asyncio.sleep(delay)
    return retries
