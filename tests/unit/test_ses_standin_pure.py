"""SES stand-in pure parts: protocol validation, templates, limits, statistics, account."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import pytest

from infra.ses_standin.account import SesAccount
from infra.ses_standin.errors import BadRequest, LimitExceeded, NotFound, TooManyRequests
from infra.ses_standin.faults import FaultConfig
from infra.ses_standin.index import Acceptances, MessageIndex
from infra.ses_standin.journal import Journal
from infra.ses_standin.limits import RollingCounter, TokenBucket, quota_left
from infra.ses_standin.protocol import (
    merge_headers,
    parse_bulk_request,
    parse_email_request,
    parse_tags,
)
from infra.ses_standin.recipients import parse_address
from infra.ses_standin.server import bulk_results_body
from infra.ses_standin.stats import bucket_counts, max_in_window, sort_points
from infra.ses_standin.templates import (
    TemplateContent,
    compile_template,
    parse_template_data,
    render_parts,
)


def bulk_body(n: int = 2, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "FromEmailAddress": "shop@example.com",
        "DefaultContent": {
            "Template": {
                "TemplateName": "promo",
                "TemplateData": json.dumps({"shop": "Flash", "name": "friend"}),
                "Headers": [{"Name": "X-Campaign", "Value": "default"}],
            }
        },
        "DefaultEmailTags": [{"Name": "campaign", "Value": "42"}],
        "BulkEmailEntries": [
            {
                "Destination": {"ToAddresses": [f"u{i}@example.com"]},
                "ReplacementTags": [{"Name": "seq", "Value": str(i)}],
                "ReplacementEmailContent": {
                    "ReplacementTemplate": {
                        "ReplacementTemplateData": json.dumps({"name": f"N{i}"})
                    }
                },
            }
            for i in range(n)
        ],
    }
    body.update(overrides)
    return body


# ---- protocol ----------------------------------------------------------------------------


def test_bulk_request_merges_defaults_per_entry() -> None:
    request = parse_bulk_request(bulk_body(2))
    assert request.sender == "shop@example.com"
    assert request.recipient_count == 2
    first = request.entries[0]
    assert first.tags == {"campaign": "42", "seq": "0"}
    assert first.data == {"shop": "Flash", "name": "N0"}
    assert first.headers == {"X-Campaign": "default"}
    assert first.recipients.keys == ("u0@example.com",)


@pytest.mark.parametrize("n", [0, 51])
def test_bulk_entry_count_limits(n: int) -> None:
    with pytest.raises(BadRequest):
        parse_bulk_request(bulk_body(n))


def test_bulk_fifty_entries_allowed() -> None:
    assert len(parse_bulk_request(bulk_body(50)).entries) == 50


def test_bulk_requires_from() -> None:
    body = bulk_body()
    del body["FromEmailAddress"]
    with pytest.raises(BadRequest, match="FromEmailAddress"):
        parse_bulk_request(body)


def test_bulk_rejects_sixteen_headers() -> None:
    body = bulk_body(1)
    body["BulkEmailEntries"][0]["ReplacementHeaders"] = [
        {"Name": f"X-H{i}", "Value": "v"} for i in range(16)
    ]
    with pytest.raises(BadRequest, match="maximum is 15"):
        parse_bulk_request(body)
    body["BulkEmailEntries"][0]["ReplacementHeaders"].pop()
    assert len(parse_bulk_request(body).entries[0].headers) == 16  # 15 + template default


def test_bulk_rejects_invalid_replacement_json() -> None:
    body = bulk_body(1)
    body["BulkEmailEntries"][0]["ReplacementEmailContent"]["ReplacementTemplate"][
        "ReplacementTemplateData"
    ] = "[1, 2"
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse_bulk_request(body)


def test_bulk_rejects_non_object_template_data() -> None:
    body = bulk_body(1)
    body["DefaultContent"]["Template"]["TemplateData"] = "[1, 2]"
    with pytest.raises(BadRequest, match="JSON object"):
        parse_bulk_request(body)


@pytest.mark.parametrize(
    ("name", "value"),
    [("campaign", "a b"), ("campaign", "a.b"), ("campaign", "a@b"), ("c d", "1"), ("x", "")],
)
def test_tags_reject_outside_documented_alphabet(name: str, value: str) -> None:
    with pytest.raises(BadRequest):
        parse_tags([{"Name": name, "Value": value}], "Tags")


def test_tags_accept_documented_alphabet_up_to_256() -> None:
    value = "A-z_0" + "9" * 251
    assert parse_tags([{"Name": "seq_no-1", "Value": value}], "Tags") == {"seq_no-1": value}
    with pytest.raises(BadRequest):
        parse_tags([{"Name": "seq", "Value": value + "9"}], "Tags")


def test_headers_merge_case_insensitively() -> None:
    merged = merge_headers({"List-Unsubscribe": "a", "X-A": "1"}, {"list-unsubscribe": "b"})
    assert merged == {"X-A": "1", "list-unsubscribe": "b"}


@pytest.mark.parametrize(
    ("given", "key"),
    [
        ("a@example.com", "a@example.com"),
        ("A.B+tag@Example.COM", "a.b+tag@example.com"),
        ("Bob <Bob@example.com>", "bob@example.com"),
        ('"Smith, J" <j@mail.example.org>', "j@mail.example.org"),
    ],
)
def test_addresses_normalize(given: str, key: str) -> None:
    assert parse_address(given, "t") == (given, key)


@pytest.mark.parametrize(
    "bad",
    [
        "plain",
        "a@b",
        "a@@example.com",
        "a b@example.com",
        "é@example.com",
        "<>",
        "",
        # what SES refuses for a bulk destination (no SMTPUTF8, no quoted strings)
        '"quoted"@example.com',
        '"a b"@example.com',
        "jürgen@example.de",
        "user@bücher.example",
        "us\x01er@example.com",
        "user@example.com\n",
        " user@example.com",
        "user@example.com ",
        "a..b@example.com",
        ".a@example.com",
        "a.@example.com",
        "a" * 65 + "@example.com",
        "user@[192.168.0.1]",
        "user@192.168.0.1",
        "user@localhost",
        "user@example.com.",
        "user@example..com",
        "user@-example.com",
        "user@example-.com",
        "user@example.-com",
        "user@example.c",
        "user@" + "b" * 64 + ".com",
        "user@" + ("b" * 62 + ".") * 4 + "comx",  # domain of 256 characters
        "@example.com",
        "user@",
    ],
)
def test_addresses_reject(bad: str) -> None:
    with pytest.raises(BadRequest, match="Illegal address"):
        parse_address(bad, "t")


@pytest.mark.parametrize(
    "good",
    [
        "a" * 64 + "@example.com",
        "user@" + ("b" * 62 + ".") * 4 + "com",  # domain of 255 characters
        "u@" + ".".join(["a" * 63] * 3) + ".com",
        "a!#$%&'*+-/=?^_`{|}~b@example.com",
        "user@example.xn--p1ai",
        "Shared@Example.COM",
    ],
)
def test_addresses_accept_the_edges(good: str) -> None:
    assert parse_address(good, "t") == (good, good.lower())


def test_one_bad_destination_refuses_the_whole_bulk_call_naming_it() -> None:
    body = bulk_body(3)
    body["BulkEmailEntries"][1]["Destination"]["ToAddresses"] = ['"q"@example.com']
    with pytest.raises(BadRequest, match=r"'\"q\"@example.com' in BulkEmailEntries\[1\]"):
        parse_bulk_request(body)


def test_destination_limit_is_fifty_recipients() -> None:
    body = bulk_body(1)
    body["BulkEmailEntries"][0]["Destination"] = {
        "ToAddresses": [f"t{i}@example.com" for i in range(30)],
        "CcAddresses": [f"c{i}@example.com" for i in range(21)],
    }
    with pytest.raises(BadRequest, match="maximum is 50"):
        parse_bulk_request(body)


def test_email_request_kinds() -> None:
    base = {"FromEmailAddress": "a@example.com", "Destination": {"ToAddresses": ["b@example.com"]}}
    simple = parse_email_request(
        {**base, "Content": {"Simple": {"Subject": {"Data": "S"}, "Body": {"Text": {"Data": "t"}}}}}
    )
    assert simple.recipients.count == 1
    with pytest.raises(BadRequest, match="exactly one"):
        parse_email_request({**base, "Content": {}})
    with pytest.raises(BadRequest, match="Destination"):
        parse_email_request(
            {
                "FromEmailAddress": "a@example.com",
                "Content": {"Template": {"TemplateName": "t"}},
            }
        )


# ---- templates ---------------------------------------------------------------------------


def test_template_renders_and_reports_missing_variables() -> None:
    compiled = compile_template(
        TemplateContent(
            subject="Hi {{ name }}, {{user.city}}!",
            text="{{#if vip}}VIP{{/if}} {{code}}",
            html="<b>{{name}}</b> {{{raw}}}",
        )
    )
    assert compiled.variables == (("name",), ("user", "city"), ("code",), ("raw",))
    data = {"name": "Ann & Bo", "user": {"city": "Hà Nội"}, "code": 7, "raw": "<i>x</i>"}
    assert compiled.render_subject(data) == "Hi Ann & Bo, Hà Nội!"
    assert compiled.missing_variable(data) is None
    assert render_parts(compiled.html, data, html_escape=True) == "<b>Ann &amp; Bo</b> <i>x</i>"
    assert render_parts(compiled.text, data) == "VIP 7"  # block tags dropped, content kept
    assert compiled.missing_variable({"name": "x", "user": {}}) == "user.city"


def test_template_values_stringify_like_javascript() -> None:
    compiled = compile_template(TemplateContent(subject="{{a}}|{{b}}|{{c}}|{{d}}"))
    assert compiled.render_subject({"a": True, "b": 2.0, "c": None, "d": 1.5}) == "true|2||1.5"


# ---- limits ------------------------------------------------------------------------------


def test_token_bucket_refuses_whole_call_and_refills() -> None:
    bucket = TokenBucket.full(10, now=100.0)
    granted, bucket = bucket.take(11, 100.0)
    assert not granted
    granted, bucket = bucket.take(10, 100.0)
    assert granted
    granted, bucket = bucket.take(1, 100.05)
    assert not granted  # 0.5 tokens
    granted, bucket = bucket.take(5, 100.5)
    assert granted
    assert bucket.available(1000.0) == 10  # never more than one second's worth


def test_token_bucket_unlimited() -> None:
    bucket = TokenBucket.full(0, now=0.0)
    assert bucket.take(10**9, 0.0)[0]


def test_rolling_counter_forgets_after_window() -> None:
    counter = RollingCounter(window_s=10.0)
    counter.add(0.0, 3)
    counter.add(5.0, 2)
    counter.add(5.0, 1)
    assert counter.total(9.9) == 6
    assert counter.total(10.0) == 3
    assert counter.total(15.1) == 0


def test_quota_left() -> None:
    assert quota_left(-1, 10**9) == float("inf")
    assert quota_left(200, 150) == 50
    assert quota_left(200, 250) == 0


# ---- statistics --------------------------------------------------------------------------


def brute_max_window(times: list[float], counts: list[int], width: float) -> int:
    return max(
        (sum(c for u, c in zip(times, counts, strict=True) if t <= u < t + width) for t in times),
        default=0,
    )


def test_max_window_edges_are_half_open() -> None:
    assert max_in_window([0.0, 0.999], [10, 10]) == 20
    assert max_in_window([0.0, 1.0], [10, 10]) == 10
    assert max_in_window([], []) == 0


def test_max_window_matches_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 40)
        times = sorted(round(rng.uniform(0, 5), 2) for _ in range(n))
        counts = [rng.randint(1, 50) for _ in range(n)]
        assert max_in_window(times, counts, 1.0) == brute_max_window(times, counts, 1.0)


def test_sort_points_handles_clock_steps() -> None:
    assert sort_points([3.0, 1.0, 2.0], [30, 10, 20]) == ([1.0, 2.0, 3.0], [10, 20, 30])


def test_bucket_counts_fill_gaps() -> None:
    rows = bucket_counts([10.2, 10.7, 12.1], [1, 2, 5], 1.0)
    assert rows == [(10.0, 3), (11.0, 0), (12.0, 5)]
    with pytest.raises(ValueError):
        bucket_counts([0.0, 10.0], [1, 1], 0.0001, max_buckets=10)


def test_acceptances_count_extra_copies() -> None:
    acc = Acceptances()
    acc.add(1.0, ["a@x.com", "b@x.com"], 0, False)
    acc.add(1.0, ["a@x.com"], 10, False)
    acc.add(2.0, ["a@x.com"], 20, True)
    assert acc.duplicates == 2
    assert acc.duplicate_destinations == ["a@x.com"]
    assert (acc.times, acc.counts) == ([1.0, 2.0], [3, 1])
    assert acc.rendering_failures == 1


# ---- faults ------------------------------------------------------------------------------


def test_fault_config_partial_update_validates() -> None:
    config = FaultConfig().updated({"p_transient": 0.5, "max_send_rate": 14})
    assert (config.p_transient, config.max_send_rate, config.p429) == (0.5, 14.0, 0.0)
    for bad in (
        {"p_hang": 1.5},
        {"latency_ms": -1},
        {"nope": 1},
        {"p429": "x"},
        {"refuse_addresses": 1},
        {"refuse_addresses": "("},
    ):
        with pytest.raises(ValueError):
            config.updated(bad)
    assert config.updated({"refuse_addresses": "^x"}).refuse_addresses == "^x"


# ---- journal and account (local files, no network) ---------------------------------------


def test_journal_cuts_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "messages.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    journal = Journal(path)
    assert [record for _, record in journal.replay()] == [{"a": 1}, {"b": 2}]
    offsets = journal.append(['{"d":4}'])
    assert journal.read(offsets) == [{"d": 4}]
    journal.close()
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n{"d":4}\n'


def make_account(tmp_path: Path, **settings: Any) -> SesAccount:
    account = SesAccount(tmp_path / "state", FaultConfig().updated(settings), seed=1)
    account.create_template(
        "promo", TemplateContent(subject="Hi {{name}} at {{shop}}", text="t"), now=0.0
    )
    return account


def test_account_bulk_send_journals_and_indexes(tmp_path: Path) -> None:
    account = make_account(tmp_path)
    seen: list[str] = []
    account.on_accepted.append(lambda record: seen.append(record["message_id"]))
    results = account.send_bulk(parse_bulk_request(bulk_body(3)), now=1000.0)
    assert [r["Status"] for r in results] == ["SUCCESS"] * 3
    assert seen == [r["MessageId"] for r in results]
    record = account.messages(campaign="42", limit=1)[0]
    assert record["subject"] == "Hi N2 at Flash"
    assert record["tags"] == {"campaign": "42", "seq": "2"}
    assert account.index.stats("42")["accepted"] == 3
    account.close()
    reopened = SesAccount(tmp_path / "state", FaultConfig(), clock=lambda: 1000.0)
    assert reopened.index.stats("42") == account.index.stats("42")
    assert reopened.account(1000.0)["SendQuota"]["SentLast24Hours"] == 3.0
    assert reopened.account(1000.0 + 86_400)["SendQuota"]["SentLast24Hours"] == 0.0
    reopened.close()


def test_account_throttles_per_recipient_and_quota(tmp_path: Path) -> None:
    account = make_account(tmp_path, max_send_rate=5, max_24h_send=4)
    with pytest.raises(TooManyRequests):
        account.send_bulk(parse_bulk_request(bulk_body(6)), now=10.0)
    results = account.send_bulk(parse_bulk_request(bulk_body(5)), now=10.0)
    assert [r["Status"] for r in results] == ["SUCCESS"] * 4 + ["ACCOUNT_DAILY_QUOTA_EXCEEDED"]
    with pytest.raises(TooManyRequests):
        account.send_bulk(parse_bulk_request(bulk_body(1)), now=10.1)  # 0.5 tokens
    single = parse_email_request(
        {
            "FromEmailAddress": "a@example.com",
            "Destination": {"ToAddresses": ["b@example.com"]},
            "Content": {"Template": {"TemplateName": "promo", "TemplateData": "{}"}},
        }
    )
    with pytest.raises(LimitExceeded):
        account.send_email(single, now=20.0)
    account.close()


def test_account_refuses_a_call_holding_an_address_the_fault_names(tmp_path: Path) -> None:
    account = make_account(tmp_path, refuse_addresses=r"^u1@")
    with pytest.raises(BadRequest, match=r"'u1@example.com' in BulkEmailEntries\[1\]"):
        account.send_bulk(parse_bulk_request(bulk_body(3)), now=1.0)
    assert account.index.stats(None)["accepted"] == 0  # nothing of the call was sent
    assert len(account.send_bulk(parse_bulk_request(bulk_body(1)), now=1.0)) == 1
    account.configure({"refuse_addresses": ""}, now=2.0)
    assert len(account.send_bulk(parse_bulk_request(bulk_body(3)), now=2.0)) == 3
    account.close()


def test_account_template_not_found_and_transient(tmp_path: Path) -> None:
    account = make_account(tmp_path, p_transient=1.0)
    body = bulk_body(2)
    body["DefaultContent"]["Template"]["TemplateName"] = "missing"
    assert {r["Status"] for r in account.send_bulk(parse_bulk_request(body), 1.0)} == {
        "TEMPLATE_NOT_FOUND"
    }
    assert {r["Status"] for r in account.send_bulk(parse_bulk_request(bulk_body(2)), 1.0)} == {
        "TRANSIENT_FAILURE"
    }
    assert account.index.stats(None)["accepted"] == 0
    with pytest.raises(NotFound):
        account.get_template("missing")
    account.close()


# ---- hand-written fast paths: the same bytes as the general path -------------------------


def _canonical(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


def test_journal_lines_are_json_dumps_of_the_records(tmp_path: Path) -> None:
    """LineEncoder writes each line by hand: it must be json.dumps of the record, byte for byte
    (non-ASCII escaped, display names, Cc/Bcc, null subject, rendering failure, config set)."""
    account = make_account(tmp_path)
    account.create_template("bare", TemplateContent(text="no subject {{x}}"), now=0.0)
    hooked: list[dict[str, Any]] = []
    account.on_accepted.append(hooked.append)
    body = bulk_body(4, ConfigurationSetName="marketing")
    body["DefaultContent"]["Template"]["TemplateData"] = json.dumps({"shop": 'Flâsh "&" \u2603'})
    entries = body["BulkEmailEntries"]
    entries[1]["Destination"] = {
        "ToAddresses": ['"Zoë, Q" <zoe@example.org>'],
        "CcAddresses": ["c@example.com"],
        "BccAddresses": ["Bé <b@example.com>", "d@example.com"],
    }
    entries[2]["ReplacementHeaders"] = [{"Name": "X-Note", "Value": 'q"uote\\ <x>'}]
    entries[3]["ReplacementEmailContent"] = {"ReplacementTemplate": {}}
    entries[3]["ReplacementTags"] = [{"Name": "campaign", "Value": "other"}]
    account.send_bulk(parse_bulk_request(body), now=1764725000.123456)
    body["DefaultContent"]["Template"]["TemplateName"] = "bare"  # subject None, x missing
    account.send_bulk(parse_bulk_request(body), now=1764725001.0)
    account.send_email(
        parse_email_request(
            {
                "FromEmailAddress": "Shöp <shop@example.com>",
                "Destination": {"ToAddresses": ["a@example.com"], "CcAddresses": ["b@ex.com"]},
                "Content": {"Simple": {"Subject": {"Data": "Sübject\n"}, "Body": {}}},
                "EmailTags": [{"Name": "campaign", "Value": "7"}],
            }
        ),
        now=1764725002.5,
    )
    raw_mail = base64.b64encode(b"From: a@example.com\r\nTo: b@example.com\r\n\r\nbody").decode()
    account.send_email(
        parse_email_request({"Content": {"Raw": {"Data": raw_mail}}}), now=1764725003.0
    )
    account.close()
    lines = (tmp_path / "state" / "messages.jsonl").read_text(encoding="ascii").splitlines()
    assert len(lines) == len(hooked) == 10
    assert lines == [_canonical(record) for record in hooked]
    assert lines == [_canonical(json.loads(line)) for line in lines]
    assert json.loads(lines[4])["rendering_failure"] is not None
    assert json.loads(lines[9])["subject"] is None


def test_bulk_results_body_is_json_dumps() -> None:
    results = [
        {"Status": "SUCCESS", "MessageId": "0100-abc-000000"},
        {"Status": "TRANSIENT_FAILURE", "Error": "Transient failure, try again later."},
        {"MessageId": "out-of-order", "Status": "SUCCESS"},
        {"Status": "SUCCESS", "MessageId": 'é"\\'},
    ]
    for chosen in (results, results[:1], []):
        expected = json.dumps({"BulkEmailEntryResults": chosen}, separators=(",", ":"))
        assert bulk_results_body(chosen) == expected


@pytest.mark.parametrize(
    "raw",
    [
        '{"name":"x"}',
        '{"a": {"b": [1, 2.5, null, true]}, "c": "\\u00e9\\ud83d\\ude00"}',
        '{"a":1,"a":2}',
        '{"n": NaN, "i": -Infinity}',
        ' {"name":"x"}',
        '{"name":"x"} ',
        '{"name":"x"}junk',
        '{"name":"x"',
        "{",
        "{}",
        "[]",
        '"text"',
        "\ufeff{}",
    ],
)
def test_template_data_parses_as_json_loads(raw: str) -> None:
    """parse_template_data scans objects without json.loads' layers: same value, same errors."""
    expected: Any
    try:
        expected = json.loads(raw)
    except ValueError as exc:
        expected = f"x is not valid JSON: {exc}"
    else:
        if not isinstance(expected, dict):
            expected = "x must be a JSON object"
    got: Any
    try:
        got = parse_template_data(raw, "x")
    except ValueError as exc:
        got = str(exc)
    assert repr(got) == repr(expected)


def test_index_add_call_equals_adding_each_message() -> None:
    rng = random.Random(5)
    one_by_one, per_call = MessageIndex(), MessageIndex()
    sent_to: dict[str, list[int]] = {}
    offset = 0
    for call in range(300):
        t = float(call // 3)
        messages = []
        for _ in range(rng.randrange(1, 6)):
            keys = tuple(f"u{rng.randrange(900)}@x.com" for _ in range(rng.randrange(1, 3)))
            messages.append((rng.choice(["", "a", "b"]), keys, offset, rng.random() < 0.2))
            for key in keys:
                sent_to.setdefault(key, []).append(offset)
            offset += 100
        for campaign, keys, at, failed in messages:
            one_by_one.add(t, campaign, keys, at, failed)
        per_call.add_call(t, messages)
    for campaign in (None, "", "a", "b", "nope"):
        assert per_call.stats(campaign) == one_by_one.stats(campaign)
        assert per_call.select(campaign) == one_by_one.select(campaign)
    assert per_call.by_destination == one_by_one.by_destination
    assert {1, 2} <= {len(v) for v in sent_to.values()}  # some got one message, some more
    for key in [*sent_to, "nobody@x.com"]:
        assert per_call.destination_offsets(key) == sent_to.get(key, [])
        assert one_by_one.destination_offsets(key) == sent_to.get(key, [])
    assert list(per_call.campaigns) == list(one_by_one.campaigns)


def test_promo_codes_each_to_one_address_and_each_address_one_code(tmp_path: Path) -> None:
    """The stand-in's promo check: a code at a second address, or a second code at one
    address, is a conflict; the same code to the same address again is only a duplicate.
    The codes are journaled (json.dumps bytes) and rebuilt from the journal at start."""
    account = make_account(tmp_path)
    hooked: list[dict[str, Any]] = []
    account.on_accepted.append(hooked.append)

    def send(pairs: list[tuple[str, str]], now: float) -> None:
        body = bulk_body(len(pairs))
        for entry, (address, code) in zip(body["BulkEmailEntries"], pairs, strict=True):
            entry["Destination"] = {"ToAddresses": [address]}
            data = {"name": "N", "promo_code": code}
            entry["ReplacementEmailContent"]["ReplacementTemplate"]["ReplacementTemplateData"] = (
                json.dumps(data)
            )
        account.send_bulk(parse_bulk_request(body), now=now)

    send([("a@example.com", "K1"), ("b@example.com", "K2")], 1.0)
    stats = account.index.stats("42")
    assert (stats["promo_codes"], stats["promo_code_destinations"]) == (2, 2)
    assert stats["promo_code_recipients"] == stats["accepted"] == 2
    assert stats["promo_code_conflicts"] == 0
    send([("A@example.com", "K1")], 2.0)  # the same mail again: a duplicate only
    assert account.index.stats("42")["promo_code_conflicts"] == 0
    assert account.index.stats("42")["duplicates"] == 1
    send([("c@example.com", "K1")], 3.0)  # one code, two addresses
    send([("b@example.com", "K3")], 4.0)  # one address, two codes
    stats = account.index.stats("42")
    assert stats["promo_code_conflicts"] == 2
    assert len(stats["promo_code_conflict_list"]) == 2
    assert account.index.stats(None)["promo_code_conflicts"] == 2
    send([("d@example.com", "K9")], 5.0)
    account.close()
    lines = (tmp_path / "state" / "messages.jsonl").read_text(encoding="ascii").splitlines()
    assert lines == [_canonical(record) for record in hooked]
    assert json.loads(lines[0])["promo_code"] == "K1"
    reopened = SesAccount(tmp_path / "state", FaultConfig(), clock=lambda: 5.0)
    assert reopened.index.stats("42") == account.index.stats("42")
    reopened.close()


def test_mail_without_a_promo_code_journals_no_field(tmp_path: Path) -> None:
    account = make_account(tmp_path)
    account.send_bulk(parse_bulk_request(bulk_body(1)), now=1.0)
    account.close()
    line = (tmp_path / "state" / "messages.jsonl").read_text(encoding="ascii")
    assert "promo_code" not in line
    assert account.index.stats(None)["promo_codes"] == 0
