"""Structured logs: `FLASHSEND_LOG_FORMAT=json` prints one JSON object per line.

Every line about a message carries its identifiers as top-level keys — campaign, partition,
offset, seq, dedupe_key, event_id, attempts (and provider_id, reason, table …) — so "why did
this customer get two mails?" is one `jq` filter over the logs. They come from `extra={…}`
on the call, or from `key=value` pairs in the message itself: the workers already log
`partition=3 offset=1207 reason=…` and `dedupe_key=… event_id=… attempts=…`, and the
formatter lifts those pairs into fields, so no call site needs rewriting.
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
from datetime import UTC, datetime
from typing import Any

FIELDS = (
    "campaign",
    "campaign_id",
    "partition",
    "offset",
    "seq",
    "dedupe_key",
    "event_id",
    "attempts",
    "provider_id",
    "reason",
    "outcome",
    "table",
    "id",
    "replay_id",
)
_PAIR = re.compile(r"\b(" + "|".join(FIELDS) + r")=([^\s,;]+)")
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def _value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": message,
        }
        for key, value in _PAIR.findall(message):
            out.setdefault(key, _value(value))
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, int | float | str | bool) else str(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def logging_config(log_format: str, level: str = "warning") -> dict[str, Any] | None:
    """A dictConfig for `log_format` (None: keep the default text logging)."""
    if log_format != "json":
        return None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            },
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
    }


def configure(log_format: str, level: str = "warning") -> None:
    """For processes that are not Faust workers (relay, webhook, commands)."""
    config = logging_config(log_format, level)
    if config is None:
        logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(message)s")
        return
    logging.config.dictConfig(config)
