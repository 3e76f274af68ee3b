"""The project's one root exception. The CLI prints any of these as a single line."""

from __future__ import annotations


class FlashsendError(Exception):
    """flashsend failed."""

    def __str__(self) -> str:
        # A subclass raised without arguments uses its docstring as its message.
        return super().__str__() or (type(self).__doc__ or type(self).__name__).strip()


class UsageError(FlashsendError):
    """The command was given something it cannot act on."""


class NotFound(FlashsendError):
    """No such object."""


class Conflict(UsageError):
    """The object is not in a state that allows this."""

    def __init__(self, message: str = "", state: str | None = None) -> None:
        super().__init__(message)
        self.state = state
