"""JSON log lines carry message identifiers; metrics helpers count what they are given."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from flashsend import metrics
from flashsend.logs import JsonFormatter, logging_config


def test_json_lines_lift_message_fields() -> None:
    record = logging.makeLogRecord(
        {
            "name": "flashsend.mail.sender",
            "levelname": "INFO",
            "levelno": logging.INFO,
            "msg": "mail dedupe_key=%s event_id=%s attempts=%s outcome=%s",
            "args": ("order-confirmed:42", "0190-abc", 2, "sent"),
            "campaign": 7,
        }
    )
    line = json.loads(JsonFormatter().format(record))
    assert line["dedupe_key"] == "order-confirmed:42" and line["event_id"] == "0190-abc"
    assert line["attempts"] == 2 and line["outcome"] == "sent" and line["campaign"] == 7
    assert line["level"] == "info" and line["logger"] == "flashsend.mail.sender"
    assert logging_config("text") is None and logging_config("json") is not None


@dataclass
class R:
    status: str


def test_count_results_per_campaign_and_status() -> None:
    def value(status: str) -> float:
        v = metrics.REGISTRY.get_sample_value(
            "flashsend_recipients_total", {"campaign": "991", "status": status}
        )
        return v or 0.0

    before = value("sent")
    metrics.count_results(991, [R("sent"), R("sent"), R("failed")])
    metrics.count_skipped([991, 991], 4)
    assert value("sent") == before + 2 and value("failed") >= 1 and value("skipped") >= 4


def _line(msg: str, *args: object) -> dict[str, object]:
    record = logging.makeLogRecord(
        {"name": "flashsend.t", "levelname": "WARNING", "msg": msg, "args": args}
    )
    return dict(json.loads(JsonFormatter().format(record)))


def test_fields_are_the_call_arguments_with_their_types() -> None:
    # The mail and feedback consumers' poison line, verbatim: a reason with spaces stays whole.
    line = _line(
        "poison record to DLQ: partition=%s offset=%s reason=%s %s",
        3,
        1207,
        "bad record",
        "ValueError: year 33658 is out of range",
    )
    assert line["partition"] == 3 and line["offset"] == 1207
    assert line["reason"] == "bad record"
    # The sender's and feedback agent's lines name the campaign by a word before its value.
    line = _line("campaign %s paused automatically: %s", 42, "complaint rate 0.2 %")
    assert line["campaign_id"] == 42
    line = _line("partition %s: another worker owns it now (epoch %s held here is stale)", 5, 9)
    assert line["partition"] == 5 and "offset" not in line
    assert _line("100%% of partition=%d", 7)["partition"] == 7  # %% takes no argument
    text_only = _line("text only campaign=9 seq=12")  # no arguments: pairs of the text
    assert text_only["campaign_id"] == 9 and text_only["seq"] == 12
