"""Writing a named counter: +1 on one of its shards in one commit, tried again on another shard when it collides.

Where the two backends differ (docs/backends.md), one ShardWriter each, chosen by what the process's Datastore
offers (core/datastore.py builds ServerIncrements for Firestore only):
- Firestore in Datastore mode (`BlindShardWriter`): a blind server-side increment, no read, so no lock to wait on;
  the idempotency marker is inserted in the same commit.
- Legacy Datastore (`TransactionalShardWriter`): a read-modify-write transaction (the legacy emulator drops
  server-side increments); the marker is read and written in the same transaction.
"""
import random
from collections.abc import Callable

from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import clock, runtime
from core.datastore import ServerIncrements
from core.transactions import Call, backoff, retried
from counters.models import AppliedIncrement, CounterShard, total_cache_key

MAX_ATTEMPTS = 100
# One shard, nowhere else to go: wait a random time up to 0.5 s, 1 s, 2 s, then 4 s (full jitter); the figures
# behind it are in bench/results/counters.md.
SINGLE_SHARD_BACKOFF = 0.25
SINGLE_SHARD_BACKOFF_CAP = 4.0


def commit_on_a_shard(num_shards: int, attempt: Callable[[int], bool],
                      on_attempt: Callable[[int, bool], int] | None = None) -> tuple[bool, int, int]:
    """`attempt(shard)` (one commit: a ShardWriter) on a random shard, through the app's one retry loop, whose
    collision policy here is: another shard at once. Any other shard is as good a place for the +1 and probably free,
    where ndb's retry would wait from 1 s and try the same one (the writers read with `retries=0` for that reason).
    With one shard there is nowhere to go, and an immediate retry meets the same writers: a jittered backoff.
    `on_attempt(num_shards, collided)`, if given, hears of every attempt and returns the shard count to go on with
    (growth.listener). Returns (attempt's result, attempts made, shard used)."""
    shard, attempts = random.randrange(num_shards), 0

    def once() -> bool:
        nonlocal attempts
        attempts += 1
        return attempt(shard)

    def another_shard(collisions: int) -> None:
        nonlocal num_shards, shard
        if on_attempt:
            num_shards = on_attempt(num_shards, True)
        if num_shards > 1:
            shard = (shard + random.randrange(1, num_shards)) % num_shards  # any shard but this one
        else:
            backoff(collisions + 1, SINGLE_SHARD_BACKOFF, SINGLE_SHARD_BACKOFF_CAP)

    result = retried(once, another_shard, MAX_ATTEMPTS, "The counter is too contended right now; try again.")
    if on_attempt:  # outside `retried`: if growing fails, the +1 that already committed is not tried again
        on_attempt(num_shards, False)
    return result, attempts, shard


class ShardWriter:
    """`writer(index)`: +1 on the counter's shard `index` in one commit; True when it counted (False: the
    Idempotency-Key's marker was written by another call). The marker's stamp is this writer's `call`, so the call's
    own retry after an UNKNOWN commit still answers "applied". Then, only after the commit and only once, the cached
    total is `incr`ed (which never creates it: a missing total is summed on the next read)."""

    def __init__(self, name: str, marker_key: ndb.Key | None) -> None:
        self.name, self.marker_key, self.call = name, marker_key, Call()

    def __call__(self, index: int) -> bool:
        raise NotImplementedError

    def _counted(self) -> bool:
        runtime.cache().incr(total_cache_key(self.name))
        return True


class BlindShardWriter(ShardWriter):
    """Firestore in Datastore mode: a server-side increment, the marker inserted in the same commit."""

    def __init__(self, name: str, marker_key: ndb.Key | None, increments: ServerIncrements) -> None:
        super().__init__(name, marker_key)
        self.increments = increments

    def __call__(self, index: int) -> bool:
        shard = CounterShard.key_for(self.name, index)
        if self.marker_key is None:
            self.increments.commit(shard, "count", 1)
            return self._counted()
        try:
            self.increments.commit(shard, "count", 1,
                                   insert=AppliedIncrement.new(self.marker_key, self.call.id, clock.now()))
        except core_exceptions.AlreadyExists:  # the marker: this call's own UNKNOWN commit, or another call's
            marker = self.marker_key.get(use_cache=False, use_global_cache=False)
            if marker is None or not self.call.applied(marker.call):
                return False  # another call applied this key (or its marker has just been swept)
        return self._counted()


class TransactionalShardWriter(ShardWriter):
    """Legacy Datastore: the marker and the shard read and written in one transaction."""

    def __call__(self, index: int) -> bool:
        def txn() -> bool:
            marker = self.marker_key.get(retries=0) if self.marker_key else None
            if marker is not None and not self.call.applied(marker.call):
                return False  # another call applied this key
            if marker is None:  # (else this call's own commit answered UNKNOWN yet applied: write nothing again)
                if self.marker_key:
                    AppliedIncrement.new(self.marker_key, self.call.id, clock.now()).put()
                key = CounterShard.key_for(self.name, index)
                shard = key.get(retries=0) or CounterShard(key=key)  # created on its first increment
                shard.count += 1
                shard.put()
            ndb.get_context().call_on_commit(self._counted)  # the total's incr, once, after the commit
            return True
        return ndb.transaction(txn, retries=0)


def shard_writer(name: str, marker_key: ndb.Key | None) -> Callable[[int], bool]:
    """The writer for this process's backend: blind increments where its Datastore applies them."""
    increments = runtime.current().datastore.increments
    if increments is None:
        return TransactionalShardWriter(name, marker_key)
    return BlindShardWriter(name, marker_key, increments)
