"""Errors raised while setting up or running the local stack.

Each one is printed as a single line by the CLI (no stack trace): its message says what is
missing and how to fix it.
"""

from __future__ import annotations

from flashsend.errors import FlashsendError


class StackError(FlashsendError):
    """The local stack could not be set up or started."""


class PrerequisiteMissing(StackError):
    """A tool the stack needs (java, mvn, …) is not installed."""


class PortInUse(StackError):
    """A port the stack wants to listen on is already taken by another program."""


class ServiceFailed(StackError):
    """A service did not become ready in time; its log has the details."""
