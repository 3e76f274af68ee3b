"""Command groups. Each module exposes `register(subparsers)`; add new ones to registry()."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def registry() -> list[Register]:
    from flashsend.commands import (  # operations, schemas: issue 8
        aws,
        bench,
        campaign,
        control,
        demo,
        events,
        feedback,  # issue 5
        mail,
        operations,
        schemas,
        stack,
        worker,
    )

    return [
        stack.register,
        campaign.register,
        control.register,
        worker.register,
        demo.register,
        bench.register,
        mail.register,
        feedback.register,  # webhook, feedback status|bench|e2e (issue 5)
        events.register,  # events pull (SQS ingest)
        aws.register,  # aws plan|apply
        schemas.register,
        operations.register,  # after control: adds `dlq show|replay`
    ]
