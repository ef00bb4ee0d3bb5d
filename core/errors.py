"""Errors with a status, a slug and a sentence for the user; raised by services, rendered by views."""
from typing import TypeVar

T = TypeVar("T")


class AppError(Exception):
    status = 400
    code = "bad_request"
    retry_after: int | None = None  # seconds, sent as Retry-After (a 429's)

    def __init__(self, message: str, code: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status


class BadInput(AppError):
    status, code = 400, "bad_input"


class Unprocessable(AppError):
    status, code = 422, "invalid"


class SignInRequired(AppError):
    status, code = 401, "sign_in_required"


class Forbidden(AppError):
    status, code = 403, "forbidden"


class NotFound(AppError):
    status, code = 404, "not_found"


class Conflict(AppError):
    status, code = 409, "conflict"


class Unavailable(AppError):
    """A dependency did not answer in time, or contention outlasted our retries: the client may try again."""
    status, code = 503, "unavailable"


def found(value: T | None, message: str, code: str) -> T:
    if value is None:
        raise NotFound(message, code)
    return value
