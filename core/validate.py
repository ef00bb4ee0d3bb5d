"""Checks shared by every feature's input: bounded text, whole numbers from URLs or JSON, idempotency keys."""
import hashlib
import re

from core.errors import BadInput, Unprocessable

IDEMPOTENCY_KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,100}")  # printable ASCII, no spaces


def text(value: object, field: str, high: int, strip: bool = False) -> str:
    """`value` if it is a string of 1..high characters, not all blank and without control characters (tab and line
    breaks allowed), else a 422 naming `field`. `strip` trims it first."""
    if not isinstance(value, str):
        raise Unprocessable(f"{field} must be text.", f"bad_{field}")
    if strip:
        value = value.strip()
    if not 1 <= len(value) <= high or not value.strip():
        raise Unprocessable(f"{field} must be 1 to {high} characters, not all blank.", f"bad_{field}")
    if any(ord(c) < 32 and c not in "\t\n\r" or c == "\x7f" for c in value):
        raise Unprocessable(f"{field} must not contain control characters.", f"bad_{field}")
    return value


def whole_number(value: object, field: str, low: int, high: int, default: int | None = None,
                 from_json: bool = False) -> int:
    """An int within low..high, else an error naming `field`. None gives `default` when there is one.

    From a URL or a form (the default) a string of digits counts, and a wrong value is a 400: the request itself is
    malformed. `from_json`: a value in a JSON body must be a JSON number (not a bool, not "12"), and a wrong one is a
    422: the body parsed, its content is what cannot be done."""
    if value is None and default is not None:
        return default
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= len(str(high)) \
            and not from_json:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        error = Unprocessable if from_json else BadInput
        raise error(f"{field} must be a whole number from {low} to {high}.", f"bad_{field}")
    return value


def idempotency_key(value: str | None) -> str | None:
    """An Idempotency-Key header (or a form's token): None, or 1 to 100 printable ASCII characters without spaces."""
    if value is not None and not IDEMPOTENCY_KEY_PATTERN.fullmatch(value):
        raise BadInput("Idempotency-Key must be 1 to 100 printable ASCII characters without spaces.",
                       "bad_idempotency_key")
    return value


def id_for_key(user: str, idempotency_key: str, digits: int) -> str:
    """An id of `digits` hex digits that a user's idempotency key names: what the key starts (a job, a seed) is stored
    or enqueued under it, so a resend of the request finds it or is dropped by name instead of starting it again. The
    key is the user's own: another user's same key names another id."""
    return hashlib.sha256(f"{user}\n{idempotency_key}".encode()).hexdigest()[:digits]
