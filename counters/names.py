"""Counter names: public ones, a feature's own ("<owner>:<name>", kept by an OwnedCounters handle), and the cache
keys of a counter's total and of its shard view."""
import re

from core import validate
from core.errors import BadInput, Forbidden

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,100}")
# A feature's own counters are named "<owner>:<name>". Public names cannot contain the ':' (NAME_PATTERN), so no name
# anyone can create through the public API is ever one of them, whatever features are added later.
OWNER_SEPARATOR = ":"
OWNER_PATTERN = re.compile(r"[a-z]{1,20}")
MAX_SHARDS = 1000


def validate_name(name: object) -> str:
    """A public counter's name, or a feature's own ("<owner>:<name>", made by an OwnedCounters handle)."""
    if isinstance(name, str):
        owner, separator, rest = name.rpartition(OWNER_SEPARATOR)
        if (not separator or OWNER_PATTERN.fullmatch(owner)) and NAME_PATTERN.fullmatch(rest):
            return name
    raise BadInput("A counter name is 1 to 100 characters of letters, digits, '_', '.' and '-'.", "bad_name")


def public_name(name: object) -> str:
    """`name` as the public API may use it: 403 for a feature's own counter, whoever asks (an admin too: only the
    feature that owns it keeps it right), 400 for a malformed name."""
    if isinstance(name, str) and OWNER_SEPARATOR in name:
        raise Forbidden(f"Counter {name!r} is kept by the app itself; it cannot be read or changed here.",
                        "reserved_counter")
    return validate_name(name)


def validate_num_shards(value: object) -> int:
    return validate.whole_number(value, "num_shards", 1, MAX_SHARDS, from_json=True)


def total_cache_key(name: str) -> str:
    return f"counter-total:{name}"


def shard_view_cache_key(name: str, num_shards: int) -> str:
    """The cached copy of a counter's shard counts; the shard count is in the key, so a counter that grew is read
    afresh at once instead of being drawn with its old number of shards."""
    return f"counter-shards:{name}:{num_shards}"
