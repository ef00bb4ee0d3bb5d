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
from typing import TypeVar

from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import clock, idempotency, runtime
from core.datastore import ServerIncrements
from core.errors import Conflict
from core.transactions import Call, backoff, retried
from counters.models import AppliedIncrement, CounterShard, total_cache_key

T = TypeVar("T")
MAX_ATTEMPTS = 100
# One shard, nowhere else to go: wait a random time up to 0.5 s, 1 s, 2 s, then 4 s (full jitter); the figures
# behind it are in bench/results/counters.md.
SINGLE_SHARD_BACKOFF = 0.25
SINGLE_SHARD_BACKOFF_CAP = 4.0


def commit_on_a_shard(num_shards: int, attempt: Callable[[int], T],
                      on_attempt: Callable[[int, bool], int] | None = None) -> tuple[T, int, int]:
    """`attempt(shard)` (one commit: a ShardWriter) on a random shard, through the app's one retry loop, whose
    collision policy here is: another shard at once. Any other shard is as good a place for the +1 and probably free,
    where ndb's retry would wait from 1 s and try the same one (the writers read with `retries=0` for that reason).
    With one shard there is nowhere to go, and an immediate retry meets the same writers: a jittered backoff.
    `on_attempt(num_shards, collided)`, if given, hears of every attempt and returns the shard count to go on with
    (growth.listener). Returns (attempt's result, attempts made, shard used)."""
    shard, attempts = random.randrange(num_shards), 0

    def once() -> T:
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
    """`writer(index)`: +1 on the counter's shard `index` in one commit, with the Idempotency-Key's marker when the
    request has one; None when this call counted, else the answer the key's first request kept (a replay: nothing
    counted). What was found under the key is `idempotency.found`'s to say, so this call's own retry after an
    UNKNOWN commit still counts as applied. Then, only after the commit and only once, the cached total is `incr`ed
    (which never creates it: a missing total is summed on the next read)."""

    def __init__(self, name: str, request: idempotency.Keyed | None) -> None:
        self.name, self.request, self.call, self.attempts = name, request, Call(), 0
        self.marker_key = AppliedIncrement.key_for(request) if request else None

    def __call__(self, index: int) -> dict | None:
        self.attempts += 1
        return self.write(index)

    def write(self, index: int) -> dict | None:
        raise NotImplementedError

    def _marker(self, index: int) -> AppliedIncrement:
        assert self.request is not None
        return AppliedIncrement.new(self.request, self.call.id, {"attempts": self.attempts, "shard": index},
                                    clock.now())

    def _counted(self) -> None:
        runtime.cache().incr(total_cache_key(self.name))


class BlindShardWriter(ShardWriter):
    """Firestore in Datastore mode: a server-side increment, the marker inserted in the same commit."""

    def __init__(self, name: str, request: idempotency.Keyed | None, increments: ServerIncrements) -> None:
        super().__init__(name, request)
        self.increments = increments

    def write(self, index: int) -> dict | None:
        shard = CounterShard.key_for(self.name, index)
        if self.marker_key is None:
            self.increments.commit(shard, "count", 1)
            self._counted()
            return None
        try:
            self.increments.commit(shard, "count", 1, insert=self._marker(index))
        except core_exceptions.AlreadyExists as exists:  # the marker: this call's own UNKNOWN commit, or another's
            marker = self.marker_key.get(use_cache=False, use_global_cache=False)
            if marker is None:  # swept between the commit and this read: its day is long over, nothing to answer
                raise Conflict("This Idempotency-Key's increment has expired; use a new key.",
                               "idempotency_key_expired") from exists
            if idempotency.found(marker, self.request, self.call) == idempotency.REPLAY:
                return idempotency.answer_of(marker)  # another call applied this key: nothing counted
        self._counted()
        return None


class TransactionalShardWriter(ShardWriter):
    """Legacy Datastore: the marker and the shard read and written in one transaction."""

    def write(self, index: int) -> dict | None:
        def txn() -> dict | None:
            marker = self.marker_key.get(retries=0) if self.marker_key else None
            outcome = idempotency.found(marker, self.request, self.call)
            if outcome == idempotency.REPLAY:
                return idempotency.answer_of(marker)  # another call applied this key: nothing counted
            if outcome == idempotency.NEW:  # (MINE: this call's own commit answered UNKNOWN yet applied: not again)
                if self.marker_key:
                    self._marker(index).put()
                key = CounterShard.key_for(self.name, index)
                shard = key.get(retries=0) or CounterShard(key=key)  # created on its first increment
                shard.count += 1
                shard.put()
            ndb.get_context().call_on_commit(self._counted)  # the total's incr, once, after the commit
            return None
        return ndb.transaction(txn, retries=0)


def shard_writer(name: str, request: idempotency.Keyed | None) -> ShardWriter:
    """The writer for this process's backend: blind increments where its Datastore applies them."""
    increments = runtime.current().datastore.increments
    if increments is None:
        return TransactionalShardWriter(name, request)
    return BlindShardWriter(name, request, increments)
