"""Writing a counter: +1 on one of its shards in one commit, on another shard at once when that one is contended.

Where the two backends differ (see docs/backends.md), one ShardWriter each, chosen by what the process's
Datastore offers (core/datastore.py builds ServerIncrements for Firestore only):
- Firestore in Datastore mode (`BlindShardWriter`): a blind server-side increment, no read, so no lock to wait on.
  The idempotency marker is inserted in the same commit; if it exists, nothing was written and the marker says whose
  it is.
- Legacy Datastore (`TransactionalShardWriter`): a read-modify-write transaction (the legacy emulator drops
  server-side increments). Optimistic concurrency: a collision aborts at commit, at once, and the loop moves to
  another shard. The marker is read and written in the same transaction.
"""
import random
import uuid
from collections.abc import Callable

from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import clock, runtime
from core.errors import Unavailable
from core.transactions import backoff, is_contention
from counters.models import AppliedIncrement, CounterShard, total_cache_key

MAX_ATTEMPTS = 100
# One shard, nowhere else to go: wait a random time up to 0.5 s, 1 s, 2 s, then 4 s (full jitter); the figures
# behind it are in bench/results/counters.md.
SINGLE_SHARD_BACKOFF = 0.25
SINGLE_SHARD_BACKOFF_CAP = 4.0


def commit_on_a_shard(num_shards: int, attempt: Callable[[int], bool],
                      on_attempt: Callable[[int, bool], int] | None = None) -> tuple[bool, int, int]:
    """Run `attempt(shard_index)` (one commit: a ShardWriter) on a random shard; on contention, another shard at once.

    ndb's own retry would wait (backoff from 1 s) and then try the same shard again, which is the worst move for a
    counter: any other shard is an equally good place for the +1 and is probably free right now. For the same reason
    the writers read with `retries=0`: a lookup that meets a locked shard would otherwise be retried by ndb, with
    backoff, on that same shard before the collision ever reached this loop.
    With a single shard there is nowhere else to go, and retrying at once only collides again with the same writers
    (bench/results/counters.md), so there it waits a random, growing while.
    `on_attempt(num_shards, collided)`, if given, hears of every attempt and returns the shard count to go on with.
    Returns (attempt's result, attempts made, shard used).
    """
    shard = random.randrange(num_shards)
    for attempts in range(1, MAX_ATTEMPTS + 1):
        try:
            result = attempt(shard)
        except Exception as e:  # noqa: BLE001 - only contention is retried; anything else is re-raised
            if not is_contention(e):
                raise
            if on_attempt:
                num_shards = on_attempt(num_shards, True)
            if num_shards > 1:
                shard = (shard + random.randrange(1, num_shards)) % num_shards  # any shard but this one
            else:
                backoff(attempts, SINGLE_SHARD_BACKOFF, SINGLE_SHARD_BACKOFF_CAP)
            continue
        if on_attempt:
            on_attempt(num_shards, False)
        return result, attempts, shard
    raise Unavailable("The counter is too contended right now; try again.", "contention")


class ShardWriter:
    """`writer(index)`: +1 on the counter's shard `index` in one commit; True when it counted (False: the
    Idempotency-Key's marker was written before, by another call). Then the counter's cached total is `incr`ed,
    only after the commit and only once (inside a retried transaction an incr could run for an attempt that then
    aborts); incr never creates the key (pymemcache returns None for a missing one): a missing total is rebuilt from
    the shards on the next read. `token` names this call, so its own retry after a commit of unknown outcome still
    answers "applied"."""

    def __init__(self, name: str, marker_key: ndb.Key | None) -> None:
        self.name, self.marker_key, self.token = name, marker_key, uuid.uuid4().hex

    def __call__(self, index: int) -> bool:
        raise NotImplementedError

    def _counted(self) -> bool:
        runtime.cache().incr(total_cache_key(self.name))
        return True


class BlindShardWriter(ShardWriter):
    """Firestore in Datastore mode: a server-side increment, the marker inserted in the same commit."""

    def __call__(self, index: int) -> bool:
        increments = runtime.current().datastore.increments
        assert increments is not None  # shard_writer chose this writer because the backend applies them
        marker = AppliedIncrement.new(self.marker_key, self.token, clock.now()) if self.marker_key else None
        try:
            increments.commit(CounterShard.key_for(self.name, index), "count", 1, insert=marker)
        except core_exceptions.AlreadyExists:
            assert marker is not None  # only the marker can exist already
            existing = marker.key.get(use_cache=False, use_global_cache=False)
            if existing is None or existing.token != self.token:
                return False  # another call applied this key
            # This call's own earlier commit applied (it answered UNKNOWN): its total was never incr'd.
        return self._counted()


class TransactionalShardWriter(ShardWriter):
    """Legacy Datastore: the marker and the shard read and written in one transaction."""

    def __call__(self, index: int) -> bool:
        def txn() -> bool:
            if self.marker_key is not None:
                marker = self.marker_key.get(retries=0)
                if marker is not None:
                    if marker.token != self.token:
                        return False  # another call applied this key
                    # This call's own earlier commit applied (it answered UNKNOWN): its total was never incr'd.
                    ndb.get_context().call_on_commit(self._counted)
                    return True
                AppliedIncrement.new(self.marker_key, self.token, clock.now()).put()
            key = CounterShard.key_for(self.name, index)
            shard = key.get(retries=0) or CounterShard(key=key)  # created on its first increment
            shard.count += 1
            shard.put()
            ndb.get_context().call_on_commit(self._counted)
            return True
        return ndb.transaction(txn, retries=0)


def shard_writer(name: str, marker_key: ndb.Key | None) -> Callable[[int], bool]:
    """The writer for this process's backend: blind increments where its Datastore applies them."""
    blind = runtime.current().datastore.increments is not None
    return (BlindShardWriter if blind else TransactionalShardWriter)(name, marker_key)
