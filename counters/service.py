"""Sharded counters: the talk's first lesson.

The talk's own counter is counters/simple.py, whole; read it first (why a counter is shards). Beyond it, two kinds
live here:
- named `general` counters: a CounterConfig with `num_shards`, the total cached;
- named `adaptive` counters: start with one shard and multiply them while increments keep colliding, up to a cap.

This module is the increment and the handle other features keep their own counters through (`owned`); beside it:
models.py (the entities and names), growth.py (a counter's config, created and grown), writes.py (one +1 on a shard,
per backend), totals.py (reading counts and totals). Other features import this module only.
"""
import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.cloud import ndb

from core import clock, runtime, validate
from core.errors import SignInRequired
from counters import growth
from counters.growth import DEFAULT_SHARDS, configure, get_config, require_config
from counters.models import (
    OWNER_SEPARATOR,
    AppliedIncrement,
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
    applied: bool
    attempts: int  # transactions tried; more than 1 means the increment met contention
    shard: int


def increment(name: str, idempotency_key: str | None = None, mode: str = "general", listed: bool = True,
              create: bool = True) -> Increment:
    """Add 1 to counter `name` (created in `mode`, `listed` or not, on first use; with `create` False a counter that
    does not exist is a SignInRequired and nothing is written: the public API lets anyone add to a counter, but only
    a signed-in user create one, since an anonymous path that creates entities is a storage flood).

    With an idempotency key the increment is applied at most once however often the client retries: the marker entity
    is written in the same commit as the shard's increment, so both exist or neither does. A commit whose outcome is
    unknown (an UNKNOWN error) is retried too; without a key such a retry could count twice, with one it cannot.
    """
    validate_name(name)
    validate.idempotency_key(idempotency_key)
    config = get_config(name)
    if config is None:
        if not create:
            raise SignInRequired(f"There is no counter named {name!r}; sign in to create it.", "sign_in_to_create")
        config = configure(name, mode, listed=listed)
    marker_key = AppliedIncrement.key_for(name, idempotency_key) if idempotency_key else None
    attempt = shard_writer(name, marker_key)

    def on_attempt(num_shards: int, collided: bool) -> int:
        factor = growth.contention.observe(name, num_shards, collided)
        if factor:
            grown = num_shards
            try:
                grown = growth.grow(name, num_shards, factor)
            finally:  # a fresh window at the size the counter has, even when grow raised
                growth.contention.restart(name, grown)
            return grown
        if collided:
            # Another writer may have grown the counter since this increment began: retry over all its shards.
            # Only a committed shard count is safe to use, since a total sums the shards below it.
            return max(num_shards, require_config(name).num_shards)
        return num_shards

    applied, attempts, shard = commit_on_a_shard(
        config.num_shards, attempt, on_attempt if config.mode == "adaptive" else None)
    if marker_key is not None and applied:
        _sweep_this_hour()
    return Increment(applied, attempts, shard)


# --- expiring idempotency markers (models.AppliedIncrement) ---------------------------------------------------------

SWEEP_HANDLER = "counters.sweep_markers"
SWEEP_BATCH = 500  # keys a query fetches and one commit deletes (a commit takes at most 500 mutations)
SWEEP_BATCHES = 20  # per task; a task with more to do enqueues the next one, so none runs long
_SWEPT = "counters.swept_hour"  # the runtime's note of the last hour this process asked for a sweep


def _sweep_this_hour() -> None:
    """After a marker was written: make sure a sweep runs this hour. Each process asks once an hour (no I/O on any
    other increment), and the task is named after the hour, so every process's request is the same one task (a queue
    drops a name used before: core/tasks.py). Never fails the increment it follows."""
    hour = clock.now().strftime("%Y%m%d%H")
    noted = runtime.current().registry(_SWEPT)
    if noted.get("hour") == hour:
        return
    noted["hour"] = hour
    try:
        runtime.tasks().enqueue(SWEEP_HANDLER, {"hour": hour, "part": 0}, f"counters-sweep-{hour}-0")
    except Exception:  # noqa: BLE001 - no queue here (a script) or the queue is away: the next hour asks again
        log.warning("could not enqueue the idempotency markers' sweep", exc_info=True)


def sweep_markers(payload: dict[str, Any], attempt: int = 0) -> dict[str, Any]:
    """A task: delete the markers that have expired, SWEEP_BATCHES batches at most, then hand on to the next part.
    Keys only: a keys-only query is billed as one read, not one per entity (https://cloud.google.com/datastore/pricing).
    Eventually consistent on legacy Datastore: a key deleted a moment ago may come back once, and deleting it again is
    harmless. A marker is never rewritten, so a delete cannot race with a change to it; an increment retried after its
    marker went is applied again, as the key's lifetime allows."""
    now, deleted = clock.now(), 0
    for _ in range(SWEEP_BATCHES):
        keys = AppliedIncrement.query(AppliedIncrement.expires <= now).fetch(SWEEP_BATCH, keys_only=True)
        if not keys:
            return {"deleted": deleted}
        ndb.delete_multi(keys)
        deleted += len(keys)
    part = int(payload.get("part", 0)) + 1
    runtime.tasks().enqueue(SWEEP_HANDLER, {"hour": payload["hour"], "part": part},
                            f"counters-sweep-{payload['hour']}-{part}")
    return {"deleted": deleted, "more": True}


class OwnedCounters:
    """A feature's own counters (an entry's views, its comments), under the reserved name "<owner>:<name>".

    The feature that owns them is the only writer: the public API refuses their names (403) and never lists them, so
    nobody can forge an entry's comment count. Adaptive and unlisted: most are written rarely (one shard) and a few by
    many at once (they grow). Everything here takes and returns the feature's own short names.
    """

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
        except Exception:  # noqa: BLE001 - whatever failed, the request it rides on has done its own work
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

    def configure(self, short: str, num_shards: int) -> CounterConfig:
        """Create the counter with `num_shards` shards when it does not exist (or grow it to that many): for one
        that many transactions will add to at once (`add_in_transaction`), which must not race to create it."""
        return configure(self.name(short), "adaptive", num_shards, listed=False)

    def add_in_transaction(self, short: str, delta: int) -> list[ndb.Model]:
        """Inside the caller's transaction: add `delta` (negative too) to a random one of the counter's shards,
        creating the counter (one shard) when it does not exist. Returns the entities for the caller to put with its
        own; the cached total is dropped once the transaction commits. Two entity groups (config and shard): the
        caller's transaction must have room for them. The shard is random so that many transactions adding at once
        (a mapper's chunks) rarely meet on one; they commit or abort with the caller's writes, so no add is lost or
        made twice."""
        name = self.name(short)
        # ndb's lookup retry kept (see mapper.tree._process: the chunk this rides on costs more when aborted).
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
