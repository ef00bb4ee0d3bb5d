"""Checks shared by every feature's input: bounded text, characters text may hold, whole numbers from URLs or JSON,
idempotency keys."""
import re

from core.errors import BadInput, Unprocessable

IDEMPOTENCY_KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,100}")  # printable ASCII, no spaces
# Datastore refuses a key name that matches __.*__ (PathElement in
# https://cloud.google.com/datastore/docs/reference/data/rest/v1/Key): InvalidArgument. Every key name the app builds
# from a caller's chosen name starts with that name, so a name that does not start with "__" never makes one.
RESERVED_PREFIX = "__"
# What no text field holds: what XML 1.0 cannot carry (https://www.w3.org/TR/xml/#charsets: control characters but tab,
# line feed and carriage return; lone surrogates; U+FFFE and U+FFFF), what UTF-8 cannot encode (a lone surrogate:
# JSON's "\ud800" escape parses to one in Python, and Datastore's client fails to encode it, a 500 at the write), and
# what Unicode reserves as never text (its 66 noncharacters, https://www.unicode.org/faq/private_use.html#nonchar1)
# with DEL and the C1 controls. Carriage return stays: a browser sends a textarea's line breaks as CR LF.
UNSAFE_CHARACTERS = re.compile("[" + "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufdd0-\ufdef"
                               + "".join(chr(plane << 16 | 0xfffe) + chr(plane << 16 | 0xffff) for plane in range(17))
                               + "]")


FIELD_SLUG = re.compile(r"[a-z_]{1,40}")  # a field name that may be part of an error's code (bad_<field>)


def plain_characters(value: str, field: str) -> str:
    """`value`, unless it holds a character of UNSAFE_CHARACTERS: then a 422 naming `field` and the character."""
    found = UNSAFE_CHARACTERS.search(value)
    if found:
        code = f"bad_{field}" if FIELD_SLUG.fullmatch(field) else "bad_field"  # a body's own key may be anything
        raise Unprocessable(f"{field[:40]} holds U+{ord(found.group()):04X}, which text here may not: control "
                            "characters (but tab and line breaks), Unicode noncharacters and lone surrogates are "
                            "refused.", code)
    return value


def plain_json(body: dict) -> dict:
    """`body`, unless a key or string anywhere in it holds an unsafe character: a 422 naming the top-level field it is
    under. Checked when the body is parsed, so no route writes such text, whichever fields it reads."""
    for key, value in body.items():
        plain_characters(key, "field_name")
        inside = [value]  # a stack, not recursion: a body may nest as deep as the JSON parser goes
        while inside:
            item = inside.pop()
            if isinstance(item, str):
                plain_characters(item, key)
            elif isinstance(item, dict):
                inside.extend(item.keys())
                inside.extend(item.values())
            elif isinstance(item, list):
                inside.extend(item)
    return body


def without_unsafe_characters(text: str) -> str:
    """`text` with every UNSAFE_CHARACTERS character removed: for what renders text stored before it was checked (the
    Atom feed, which must stay well-formed XML)."""
    return UNSAFE_CHARACTERS.sub("", text)


def text(value: object, field: str, high: int, strip: bool = False) -> str:
    """`value` if it is a string of 1..high characters, not all blank and without unsafe characters (plain_characters:
    tab and line breaks allowed), else a 422 naming `field`. `strip` trims it first."""
    if not isinstance(value, str):
        raise Unprocessable(f"{field} must be text.", f"bad_{field}")
    if strip:
        value = value.strip()
    if not 1 <= len(value) <= high or not value.strip():
        raise Unprocessable(f"{field} must be 1 to {high} characters, not all blank.", f"bad_{field}")
    return plain_characters(value, field)


def whole_number(value: object, field: str, low: int, high: int, default: int | None = None,
                 from_json: bool = False) -> int:
    """An int within low..high, else an error naming `field`; None gives `default` when there is one. From a URL (the
    default) a string of digits counts, and a wrong value is a 400. `from_json`: a JSON number (not a bool, not "12"),
    and a wrong one is a 422: the body parsed, its content is what cannot be done."""
    if value is None and default is not None:
        return default
    if not from_json:
        value = _digits_as_int(value, len(str(high)))
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        error = Unprocessable if from_json else BadInput
        raise error(f"{field} must be a whole number from {low} to {high}.", f"bad_{field}")
    return value


def flag(value: str | None, field: str) -> bool:
    """A query string's yes or no: absent, "0" or "false" no, "1" or "true" yes; anything else a 400 naming `field`."""
    if value in (None, "0", "false"):
        return False
    if value in ("1", "true"):
        return True
    raise BadInput(f"{field} must be 1, true, 0 or false.", f"bad_{field}")


def form_number(value: str | None) -> object:
    """A form's field as whole_number(from_json=True) takes it: a string of digits as its int, anything else as is."""
    return _digits_as_int(value, 18)


def _digits_as_int(value: object, most: int) -> object:
    """A string of 1..most ASCII digits as its int (bounded: Python refuses to convert more than 4,300 digits, and no
    field takes so many); anything else unchanged."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= most:
        return int(value)
    return value


def idempotency_key(value: str | None) -> str | None:
    """An Idempotency-Key header (or a form's token): None, or 1 to 100 printable ASCII characters without spaces
    (`__k__` too: its marker's name is a digest, core/idempotency.py)."""
    if value is not None and not IDEMPOTENCY_KEY_PATTERN.fullmatch(value):
        raise BadInput("Idempotency-Key must be 1 to 100 printable ASCII characters without spaces.",
                       "bad_idempotency_key")
    return value


def not_reserved(value: str, field: str, code: str) -> str:
    """`value`, a name a caller chose that goes into key names, unless it starts with RESERVED_PREFIX: then a 400
    naming `field`, before anything is read or written."""
    if value.startswith(RESERVED_PREFIX):
        raise BadInput(f"{field} may not start with {RESERVED_PREFIX!r}: Datastore reserves key names of the form "
                       "__...__.", code)
    return value

