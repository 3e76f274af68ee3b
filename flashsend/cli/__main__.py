"""`python -m flashsend.cli`: the same as the `flashsend` command."""

import sys

from flashsend.cli.entry import run

sys.exit(run())
