"""Named counters: the talk's general counter (counters/simple.py: read it first) grown into a feature, its four parts:
- its config, a CounterConfig (`growth.configure`): `general`, 20 shards by default, or `adaptive`, one shard at
  first, multiplied while its increments keep colliding (growth.py);
- `increment` (below): +1 on a random shard in one commit by the backend's writer (writes.py), on another shard at
  once after a collision; at most once with an idempotency key;
- its total: `totals.get_total` (the cached total, else its shards summed);
- more shards: `growth.increase_shards` (the count only grows).
Other features keep their own counters through `owned` and import this module only.
"""
import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass

from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import idempotency, runtime
from core.cache import CACHE_DOWN
from core.errors import SignInRequired, Unavailable
from counters import growth
from counters.growth import DEFAULT_SHARDS, configure, get_config
from counters.models import (
    OWNER_SEPARATOR,
    CounterConfig,
    CounterShard,
    total_cache_key,
    validate_name,
)
from counters.totals import cached_totals, exact_totals
from counters.writes import commit_on_a_shard, shard_writer

log = logging.getLogger(__name__)


@dataclass
class Increment:
    applied: bool  # the API answer's `applied` field, kept for its clients: always True (a +1 not counted raises)
    attempts: int  # transactions tried; more than 1 means the increment met contention
    shard: int
    replayed: bool = False  # the key's first request counted it: this is that request's answer again


ENDPOINT = "counters.increment"  # what an increment's Idempotency-Key is scoped to, with its caller


def increment(name: str, idempotency_key: str | None = None, mode: str = "general", listed: bool = True,
              create: bool = True, caller: str | None = None) -> Increment:
    """Add 1 to counter `name`, created in `mode` (`listed` or not) on first use. With `create` False, a counter that
    does not exist is SignInRequired and nothing is written: anyone may add to a counter, but only a signed-in user
    may create one (an anonymous path that creates entities is a storage flood).

    With an idempotency key (the signed-in `caller`'s own: core/idempotency.py), applied at most once however often
    the client retries: a marker is written in the same commit as the shard's +1, so both exist or neither does, and
    a resend answers the first increment's answer. Without one, a retry of a commit that answered UNKNOWN yet applied
    counts twice (the talk's trade)."""
    validate_name(name)
    request = idempotency.keyed(idempotency_key, caller, ENDPOINT, name, None)
    config = get_config(name)
    if config is None:
        if not create:
            raise SignInRequired(f"There is no counter named {name!r}; sign in to create it.", "sign_in_to_create")
        config = configure(name, mode, listed=listed)
    grow = growth.grower(name) if config.mode == "adaptive" else None  # more shards while attempts keep colliding
    outcome, attempts = commit_on_a_shard(config.num_shards, shard_writer(name, request).write, grow)
    if outcome.wrote:  # this attempt's commit counted it, after `attempts` attempts
        return Increment(True, attempts, outcome.value["shard"])
    # MINE or ANOTHERS: the answer stored with the commit that counted (writes.ShardWriter), the same for every send.
    return Increment(True, outcome.value.get("attempts", 1), outcome.value.get("shard", 0), replayed=outcome.by_another)


class OwnedCounters:
    """A feature's own counters (an entry's views, its comments), under the reserved name "<owner>:<name>".
    Used by lessons 2-4's features (blog views, comment counts, accounts): skip it on a first read of lesson 1.
    The feature that owns them is the only writer: the public API refuses their names (403) and never lists them, so
    nobody can forge an entry's comment count. Adaptive and unlisted: most are written rarely (one shard) and a few by
    many at once (they grow). Everything here takes and returns the feature's own short names."""

    def __init__(self, owner: str) -> None:
        self.prefix = f"{owner}{OWNER_SEPARATOR}"

    def name(self, short: str) -> str:
        """The counter's full name; `short` is the feature's own (e.g. "demo.59.views")."""
        return validate_name(self.prefix + short)

    def increment(self, short: str) -> bool:
        """+1, best effort: True if it counted. A count that cannot be made now (the counter's first increment while
        the cache is away, since configs are a globally cached kind; contention beyond the retries; Datastore not
        answering) is logged and skipped, never an error for the reader or writer whose request it rides on. Without
        an idempotency key: an increment whose commit answered UNKNOWN and yet applied counts twice."""
        name = self.name(short)
        try:
            increment(name, mode="adaptive", listed=False)
            return True
        except (Unavailable, core_exceptions.GoogleAPICallError, core_exceptions.RetryError, *CACHE_DOWN):
            # what "cannot be made now" raises; anything else is a bug, and is raised
            log.warning("counter %s not incremented", name, exc_info=True)
            return False

    def totals(self, shorts: Iterable[str]) -> dict[str, int]:
        """{short: total}, 0 for a counter never created; cached totals (see `totals.cached_totals`)."""
        names = {short: self.name(short) for short in shorts}
        totals = cached_totals(list(names.values()))
        return {short: totals[name][0].count for short, name in names.items()}

    def exact_totals(self, shorts: Iterable[str]) -> dict[str, int]:
        """{short: total} summed from the shards, never from the cache."""
        names = {short: self.name(short) for short in shorts}
        totals = exact_totals(list(names.values()))
        return {short: totals[name] for short, name in names.items()}

    def configs(self, shorts: Iterable[str]) -> list[CounterConfig | None]:
        """Each counter's config (None: not created), in one batched get by key."""
        return ndb.get_multi([ndb.Key(CounterConfig, self.name(short)) for short in shorts])

    def configure(self, short: str, num_shards: int) -> CounterConfig:
        """Create the counter with `num_shards` shards when it does not exist (or grow it to that many): for one
        that many transactions will add to at once (`add_in_transaction`), which must not race to create it."""
        return configure(self.name(short), "adaptive", num_shards, listed=False)

    def add_in_transaction(self, short: str, delta: int) -> list[ndb.Model]:
        """Inside the caller's transaction: add `delta` (negative too) to a random one of the counter's shards,
        creating the counter (one shard) when it does not exist. Returns the entities for the caller to put with its
        own, so the add commits or aborts with them; the cached total is dropped after the commit. Two entity groups
        (config and shard): the caller's transaction must have room for them."""
        name = self.name(short)
        # ndb's lookup retry kept: the transaction this rides on (a seed's chunk, a job's settle) costs more aborted.
        config = ndb.Key(CounterConfig, name).get()
        writes: list[ndb.Model] = []
        if config is None:
            config = CounterConfig(id=name, mode="adaptive", num_shards=DEFAULT_SHARDS["adaptive"], listed=False)
            writes.append(config)
        key = CounterShard.key_for(name, random.randrange(config.num_shards))
        shard = key.get() or CounterShard(key=key)
        shard.count += delta
        writes.append(shard)
        ndb.get_context().call_on_commit(lambda: runtime.cache().delete(total_cache_key(name)))
        return writes


def owned(owner: str) -> OwnedCounters:
    """The handle through which the feature `owner` keeps its own counters."""
    return OwnedCounters(owner)
