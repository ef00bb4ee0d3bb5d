"""The talk's sharded counter, whole. Read this file first.

One entity that many clients write at once does not scale: Datastore commits to one entity (in 2008, one entity
group) at a limited rate (about one sustained write a second was Datastore's limit per entity group, and Google
names no higher one: https://cloud.google.com/datastore/docs/upgrade-to-firestore), and transactions that meet on it
collide and are tried again.
So this counter is twenty shard entities, each a root entity, its own entity group:
- an increment is a small transaction on one shard chosen at random, so two writers meet only when they pick the same
  shard, one time in twenty;
- the total is the sum of the twenty shards, read by key in one batch (strongly consistent, no query, no index);
- the total is also kept in the cache, read first, and incremented there after each commit.

That is the 2008 design; the code is the same on both backends (how a collision ends differs: see `increment`).
The counters in counters/service.py go beyond the talk: named counters with shards of their own number, adaptive ones
that grow while their writers collide, increments applied once per idempotency key, and Firestore's server-side
increments in place of a read and a write.
"""
import random

from google.cloud import ndb

from core import runtime
from core.transactions import transact

SHARDS = 20
TOTAL_KEY = "simple-counter-total"
# The kept total can be off by the increments in flight while a reader summed it, until it expires (then the next
# read sums again; exact reads use shard_counts()):
# - low: an increment whose commit the sum missed and whose `incr` came before the `add` (it found no copy to bump);
# - high: an increment the sum already counted whose `incr` came after the `add` (counted twice);
# - low: an increment whose `incr` the cache lost.
TOTAL_LIFETIME = 60  # seconds; the named counters' cached totals (totals.py) live as long


class SimpleCounterShard(ndb.Model):
    """One of the twenty; key name "shard-<i>", created by its first increment.

    Neither of ndb's caches: a shard is written in contended transactions (the global cache would add its lock traffic
    to each), and a total must see other writers' commits, not the copy this request read first."""
    _use_cache = False
    _use_global_cache = False
    count = ndb.IntegerProperty(default=0, indexed=False)


def shard_key(index: int) -> ndb.Key:
    return ndb.Key(SimpleCounterShard, f"shard-{index}")


def increment() -> int:
    """Add 1 to a random shard, in a transaction. Returns how many attempts that took: on the legacy emulator
    (optimistic, as Datastore was) more than 1 means it met another writer on its shard and was tried again, after a
    jittered backoff, on a shard chosen afresh; on Firestore (pessimistic) a writer of a busy shard mostly waits for its
    lock instead, and takes 1.

    A commit that fails as UNKNOWN (its answer lost, so whether it applied is not known) may have applied, and its
    retry then counts twice: the talk's counter accepts that. Beyond it, counters/service.py takes an idempotency key,
    and its writer (counters/writes.py) writes a marker in the same commit."""
    attempts = 0

    def add_one() -> None:
        nonlocal attempts
        attempts += 1
        key = shard_key(random.randrange(SHARDS))
        # retries=0: a lookup that meets a collision fails at once, and `transact` tries the whole transaction again,
        # on a shard chosen afresh, after its own short backoff instead of ndb's.
        shard = key.get(retries=0) or SimpleCounterShard(key=key)
        shard.count += 1
        shard.put()

    transact(add_one, busy_message="The counter is very busy; try again.")
    runtime.cache().incr(TOTAL_KEY)  # after the commit; with no total in the cache, nothing: the next read sums
    return attempts


def shard_counts() -> list[int]:
    """Each shard's count, from one batch of gets by key; a shard never written counts 0."""
    return [shard.count if shard else 0 for shard in ndb.get_multi([shard_key(i) for i in range(SHARDS)])]


def total() -> int:
    """The count: the cache's copy, or else the shards summed, and that sum kept for the next reader."""
    cache = runtime.cache()
    kept = cache.get(TOTAL_KEY)
    if kept is not None:
        return int(kept)
    count = sum(shard_counts())
    cache.add(TOTAL_KEY, count, expire=TOTAL_LIFETIME)  # add, not set: never overwrite a copy incrs have moved on
    return count
