"""Counter entities. Every shard is a root entity, its own entity group (about one commit a second each, sustained, in
production), never a child of its config, which would put them back in one group (docs/lessons/counters.md).
"""
import re

from google.cloud import ndb

from core import idempotency, validate
from core.errors import BadInput, Forbidden
from core.markers import ExpiringMarker

# --- names: public ones, a feature's own ("<owner>:<name>", kept by service.OwnedCounters), cache keys ---------
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,100}")
# A feature's own counters are named "<owner>:<name>". Public names cannot contain the ':' (NAME_PATTERN), so no name
# anyone can create through the public API is ever one of them, whatever features are added later.
OWNER_SEPARATOR = ":"
OWNER_PATTERN = re.compile(r"[a-z]{1,20}")
# The two shard caps: an admin's counter's, what the counters page draws at most in a view, and an adaptive one's,
# lower since it grows unattended and a total not cached reads every shard (docs/lessons/counters.md).
MAX_SHARDS = 1000
ADAPTIVE_MAX_SHARDS = 256


def validate_name(name: object) -> str:
    """A public counter's name, or a feature's own ("<owner>:<name>", made by an OwnedCounters handle)."""
    if isinstance(name, str):
        owner, separator, rest = name.rpartition(OWNER_SEPARATOR)
        if (not separator or OWNER_PATTERN.fullmatch(owner)) and NAME_PATTERN.fullmatch(rest):
            return validate.not_reserved(name, "A counter name", "bad_name")  # it starts every key name of the counter
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


class CounterConfig(ndb.Model):
    """A named counter; key name is the counter's name. Read by key on every increment and total (from the ndb global
    cache), written only when it is created or grows. Never read inside an increment's transaction, so that growing
    the counter does not abort every increment in flight. No in-context cache: a long-lived context (a worker thread)
    would keep the shard count it saw first and never spread over shards added since."""
    _use_cache = False
    mode = ndb.StringProperty(choices=("general", "adaptive"), required=True)
    num_shards = ndb.IntegerProperty(required=True, indexed=False)
    listed = ndb.BooleanProperty(default=True)  # False: kept by another feature (an entry's views), not listed
    created = ndb.DateTimeProperty(auto_now_add=True, indexed=False)

    @property
    def name(self) -> str:
        return self.key.id()


class CounterShard(ndb.Model):
    """One shard of a named counter; key name "<counter>|<index>". Uncached, as counters/simple.py's shards."""
    _use_cache = False
    _use_global_cache = False
    count = ndb.IntegerProperty(default=0, indexed=False)

    @staticmethod
    def key_for(name: str, index: int) -> ndb.Key:
        return ndb.Key(CounterShard, f"{name}|{index}")  # no counter name has a '|' (NAME_PATTERN)


class AppliedIncrement(ExpiringMarker):
    """Marks an Idempotency-Key as applied (core/idempotency.py), its fingerprint the counter's name. Written in the
    same commit as the shard it increments, so the marker exists exactly when the increment does. Its own root entity,
    not in a counter's group: a key is its caller's across counters, and only sends of that key ever contend on it."""
    _use_global_cache = False

    @staticmethod
    def key_for(request: idempotency.Keyed) -> ndb.Key:
        return ndb.Key(AppliedIncrement, request.name)
