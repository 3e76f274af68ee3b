"""Structured logs: `FLASHSEND_LOG_FORMAT=json` prints one JSON object per line.

Every line about a message carries its identifiers as top-level keys — campaign_id,
partition, offset, seq, dedupe_key, event_id, attempts (and provider_id, reason, table …) — so
"why did this customer get two mails?" is one `jq` filter over the logs. They are real fields,
with the values and types the call passed:

- `extra={…}` on the call, as is;
- the call's own arguments, paired with the placeholders of its format string:
  `log.warning("poison record: partition=%s offset=%s reason=%s", p, o, why)` gives
  `"partition": 3, "offset": 1207` (ints) and the whole `reason`, spaces included; so does a
  word before a placeholder, `"campaign %s paused"` → `"campaign_id": 42`;
- only for text without arguments, `key=value` pairs of the message.
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
# A %-placeholder of a logging format string (printf style, as `logging` applies it).
_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[a-zA-Z%]")
# What names the argument of a placeholder: `key=%s`, or `campaign %s` / `partition %s`.
_KEY_BEFORE = re.compile(r"(?:\b(" + "|".join(FIELDS) + r")=|\b(campaign|partition|seq|offset) )$")
_ALIASES = {"campaign": "campaign_id"}


def argument_fields(msg: object, args: object) -> dict[str, Any]:
    """Fields named by the format string, valued by the call's arguments. Pure."""
    if not isinstance(msg, str) or not isinstance(args, tuple) or not args:
        return {}
    out: dict[str, Any] = {}
    index = 0
    for match in _PLACEHOLDER.finditer(msg):
        if match.group() == "%%":
            continue
        if index >= len(args):
            break
        named = _KEY_BEFORE.search(msg, 0, match.start())
        if named:
            key = named.group(1) or named.group(2)
            value = args[index]
            out[_ALIASES.get(key, key)] = (
                value if isinstance(value, int | float | str | bool) else str(value)
            )
        index += 1
    return out


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
        lifted = argument_fields(record.msg, record.args)
        if not lifted:
            lifted = {_ALIASES.get(k, k): _value(v) for k, v in _PAIR.findall(message)}
        out.update({k: v for k, v in lifted.items() if k not in out})
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
