"""Command groups. Each module exposes `register(subparsers)`; add new ones to registry()."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def registry() -> list[Register]:
    from flashsend.commands import campaign, control, demo, mail, stack, worker

    return [
        stack.register,
        campaign.register,
        control.register,
        worker.register,
        demo.register,
        mail.register,
    ]
