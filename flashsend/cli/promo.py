"""`flashsend promo import|generate`: a campaign's pool of unique promo codes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import psycopg

from flashsend.errors import UsageError
from flashsend.settings import load_settings
from sinks.audit_store import Actor
from sinks.promo_store import PromoStore
from streams.rules.promo_codes import (
    ALPHABET,
    DEFAULT_PATTERN,
    MAX_CODE_LENGTH,
    SPARSENESS,
    PatternError,
    PoolFileError,
    check_count,
    parse_pattern,
    read_pool_file,
)

DESCRIPTION = """\
Each recipient of a campaign with a promo pool gets one code of the pool, bound to them in
the same transaction that claims them for sending and passed to the SES template as
{{promo_code}}. A code goes to one recipient only; a recipient keeps the code they got
(a worker killed, a row sent again after `resend-unknown`, a pause and resume). When the pool
runs out the campaign pauses with reason promo_pool_empty and nothing is sent without a code:
add codes, then `flashsend campaign resume ID`.

A pool is created while the campaign is a draft (before `campaign start`); a started campaign
with a pool may get more codes, one without a pool never gets one. `campaign status` and
`campaign report` show the codes issued and left.

Examples:
  flashsend campaign create --name sale --template flash_sale_code      # prints 42
  flashsend promo generate 42 --count 120000 --pattern 'SALE25-{8}'
  flashsend promo import 42 codes.txt          # one code per line
  flashsend campaign start 42
"""

IMPORT_HELP = f"""\
One code per line; surrounding whitespace is ignored, blank lines are skipped. Each code is
1..{MAX_CODE_LENGTH} printable ASCII characters without spaces. The file is refused as a
whole (and nothing changes) when it holds no code, a malformed code, the same code twice, or
a code the pool already has. Example: flashsend promo import 42 codes.txt
"""

GENERATE_HELP = f"""\
Draws --count new codes with a cryptographically secure generator (Python's secrets) into
the pool; codes are distinct, also from those already in it.

Pattern language: literal text with runs of random characters written {{N}} (N = 1..32).
Random characters come from {ALPHABET} (no 0/O, 1/I/L, 2/Z, 5/S, 8/B, U/V, which people
misread). Literals: letters, digits, '-', '_', '.'. Codes are at most {MAX_CODE_LENGTH}
characters. The pattern must allow {SPARSENESS:,} times more codes than --count, so a guessed
code is valid with a probability of at most 1/{SPARSENESS:,}: {{6}} gives 148 million, enough
for 148,000 codes; {{10}} gives 4.1e13.

Examples:
  flashsend promo generate 42 --count 50000                      # {DEFAULT_PATTERN}: 7KQ4HX9MRC
  flashsend promo generate 42 --count 50000 --pattern 'SALE25-{{8}}'   # SALE25-WD3JT6PA
  flashsend promo generate 42 --count 50000 --pattern '{{4}}-{{4}}-{{4}}'  # HM4R-X7QT-9CWE
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    promo = sub.add_parser(
        "promo",
        help="a campaign's pool of unique promo codes ({{promo_code}} in its template)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    psub = promo.add_subparsers(dest="promo_cmd", required=True, metavar="ACTION")
    p = psub.add_parser(
        "import",
        help="add the codes of a file (one per line) to a campaign's pool",
        description=IMPORT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("campaign", type=int, help="campaign id (a draft, or one with a pool)")
    p.add_argument("file", type=Path, help="one code per line ('-' is not supported)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_import)

    p = psub.add_parser(
        "generate",
        help="draw N new random codes into a campaign's pool",
        description=GENERATE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("campaign", type=int, help="campaign id (a draft, or one with a pool)")
    p.add_argument("--count", type=int, required=True, help="how many codes to add")
    p.add_argument("--pattern", default=DEFAULT_PATTERN, help="code pattern (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_generate)


def cmd_import(args: argparse.Namespace) -> int:
    try:
        with args.file.open(encoding="utf-8") as lines:
            codes = read_pool_file(lines)
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{args.file} is not UTF-8 text ({exc.reason}); nothing imported"
        ) from None
    except PoolFileError as exc:
        raise UsageError(f"{args.file}: {exc}") from None
    settings = load_settings()
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        store = PromoStore(conn)
        added = store.import_codes(args.campaign, codes, Actor.cli(settings.operator))
        counts = store.counts(args.campaign)
    _print(args, "imported", added, counts.left if counts else added)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    try:
        pattern = parse_pattern(args.pattern)
        check_count(pattern, args.count)
    except PatternError as exc:
        raise UsageError(str(exc)) from None
    settings = load_settings()
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        store = PromoStore(conn)
        made = store.generate(args.campaign, pattern, args.count, Actor.cli(settings.operator))
        counts = store.counts(args.campaign)
    _print(args, "generated", len(made), counts.left if counts else len(made))
    return 0


def _print(args: argparse.Namespace, verb: str, added: int, left: int) -> None:
    if args.json:
        print(json.dumps({"campaign_id": args.campaign, verb: added, "promo_codes_left": left}))
    else:
        print(f"campaign {args.campaign}: {verb} {added:,} code(s); {left:,} free in its pool")
