"""SESv2 errors as the REST-JSON protocol carries them.

One root exception; each subclass names the modeled error shape (botocore's service model
`sesv2/2019-09-27`) and its HTTP status. Its docstring is the default message. On the wire an
error is the status code, an `x-amzn-ErrorType` header naming the shape and a JSON body
`{"message": …}`, which is what botocore's rest-json parser reads into `Error.Code` /
`Error.Message`.
"""

from __future__ import annotations

import json
from typing import ClassVar


class SesError(Exception):
    """The request failed."""

    code: ClassVar[str] = "InternalFailure"
    status: ClassVar[int] = 500

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())

    @property
    def message(self) -> str:
        return str(self.args[0])

    def body(self) -> bytes:
        """JSON error body; `__type` repeats the code for parsers that ignore headers."""
        return json.dumps({"__type": self.code, "message": self.message}).encode()


class BadRequest(SesError):
    """The input you provided is invalid."""

    code = "BadRequestException"
    status = 400


class NotFound(SesError):
    """The resource you attempted to access doesn't exist."""

    code = "NotFoundException"
    status = 404


class AlreadyExists(SesError):
    """The resource specified in your request already exists."""

    code = "AlreadyExistsException"
    status = 400


class TooManyRequests(SesError):
    """Maximum sending rate exceeded."""

    code = "TooManyRequestsException"
    status = 429


class LimitExceeded(SesError):
    """Daily message quota exceeded."""

    code = "LimitExceededException"
    status = 400


class SendingPaused(SesError):
    """Sending paused for this account."""

    code = "SendingPausedException"
    status = 400


class MessageRejected(SesError):
    """The message can't be sent because it contains invalid content."""

    code = "MessageRejected"
    status = 400
