"""Writing a named counter: +1 on one of its shards in one commit, tried again on another shard when it collides.

Where the two backends differ (docs/backends.md), one ShardWriter each, chosen by what the process's Datastore offers:
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

from core import idempotency, runtime
from core.datastore import ServerIncrements
from core.errors import Conflict
from core.exactly_once import Call, Outcome, Written, once
from core.transactions import backoff, retried
from counters.models import AppliedIncrement, CounterShard, total_cache_key

T = TypeVar("T")
MAX_ATTEMPTS = 100
# One shard, nowhere else to go: wait a random time up to 0.5 s, 1 s, 2 s, then 4 s (full jitter); the figures
# behind it are in bench/results/counters.md.
SINGLE_SHARD_BACKOFF = 0.25
SINGLE_SHARD_BACKOFF_CAP = 4.0


def commit_on_a_shard(num_shards: int, attempt: Callable[[int, int], T],
                      grow: Callable[[int, bool], int] | None = None) -> tuple[T, int]:
    """`attempt(index, attempts)` (one commit: a ShardWriter's `write`; `attempts` counts it) on a random shard,
    through the app's one retry loop, whose collision policy here is: another shard at once. Any other shard is as good
    a place for the +1 and probably free, where ndb's retry would wait from 1 s and try the same one (hence the
    writers' reads with `retries=0`).
    With one shard there is nowhere to go, and an immediate retry meets the same writers: a jittered backoff.
    `grow(num_shards, collided)` (growth.grower: adaptive counters) hears each attempt and returns the shard count to
    go on with, more once enough recent ones collided. Returns (the result, naming the shard that counted; attempts)."""
    index, attempts = random.randrange(num_shards), 0

    def on_this_shard() -> T:
        nonlocal attempts
        attempts += 1
        return attempt(index, attempts)

    def another_shard(collisions: int) -> None:
        nonlocal num_shards, index
        if grow:
            num_shards = grow(num_shards, True)
        if num_shards > 1:
            index = (index + random.randrange(1, num_shards)) % num_shards  # any shard but this one
        else:
            backoff(collisions + 1, SINGLE_SHARD_BACKOFF, SINGLE_SHARD_BACKOFF_CAP)

    result = retried(on_this_shard, another_shard, MAX_ATTEMPTS, "The counter is too contended right now; try again.")
    if grow:  # outside `retried`: if growing fails, the +1 that already committed is not tried again
        grow(num_shards, False)
    return result, attempts


class ShardWriter:
    """`write(index, attempts)`: +1 on the counter's shard `index` in one commit, exactly once for a request with an
    Idempotency-Key (its marker, written with the +1, holds the call's stamp: core/exactly_once.py's `once` says which
    of three it found). The `Outcome`'s value is the answer (attempts, shard) of the commit that counted: this
    attempt's (WROTE), this call's earlier one that answered UNKNOWN yet applied (MINE: its shard, not this attempt's),
    or the key's first request's (ANOTHERS: a replay, nothing counted). After a commit that counted, and only once,
    the cached total is `incr`ed (never created: a missing total is summed on the next read)."""

    def __init__(self, name: str, request: idempotency.Keyed | None) -> None:
        self.name, self.request, self.call = name, request, Call()
        self.marker_key = AppliedIncrement.key_for(request) if request else None

    def write(self, index: int, attempts: int) -> Outcome[dict]:
        """`attempts`: commit_on_a_shard's count, this attempt included, which the marker's answer stores."""
        raise NotImplementedError

    def _look(self) -> Written | None:
        if self.marker_key is None:  # no key: nothing to look for (a retry after UNKNOWN counts again: the trade)
            return None
        return idempotency.written(self.marker_key.get(retries=0, use_cache=False, use_global_cache=False),
                                   self.request)

    def _marker(self, answer: dict, stamp: str) -> AppliedIncrement | None:
        if self.request is None:
            return None
        return AppliedIncrement.new(self.marker_key, self.request, stamp, answer)

    def _counted(self, answer: dict) -> None:
        runtime.cache().incr(total_cache_key(self.name))


class BlindShardWriter(ShardWriter):
    """Firestore in Datastore mode: a server-side increment and the marker's insert in one commit, no transaction: the
    insert is `once`'s look, failing (AlreadyExists, nothing written) when the marker exists. The three cases:
    - the first commit: `once(lambda: None, ...)` finds nothing, writes the +1 with the marker: WROTE;
    - this call's commit answered UNKNOWN yet applied, so its retry's insert fails: the marker is read and the second
      `once(lambda: written, ...)` finds this call's stamp: MINE, nothing written again, only the cached total's incr;
    - a resend of the key (another call): its insert fails the same way and the marker holds the first call's stamp:
      ANOTHERS, answered with the first call's answer, nothing written or incremented."""

    def __init__(self, name: str, request: idempotency.Keyed | None, increments: ServerIncrements) -> None:
        super().__init__(name, request)
        self.increments = increments

    def write(self, index: int, attempts: int) -> Outcome[dict]:
        answer = {"attempts": attempts, "shard": index}

        def add_one(_: None, stamp: str) -> dict:
            self.increments.commit(CounterShard.key_for(self.name, index), "count", 1,
                                   insert=self._marker(answer, stamp))
            return answer
        try:  # the insert is the look (the class's first case)
            return once(lambda: None, add_one, self._counted, self.call, run=_as_one_commit)
        except core_exceptions.AlreadyExists as exists:  # MINE or ANOTHERS: the marker says which
            written = self._look()
            if written is None:  # swept between the commit and this read: its day is long over, nothing to answer
                raise Conflict("This Idempotency-Key's increment has expired; use a new key.",
                               "idempotency_key_expired") from exists
            return once(lambda: written, add_one, self._counted, self.call, run=_as_one_commit)


def _as_one_commit(commit: Callable[[], T]) -> T:
    """`once`'s `run` when the write's commit is its own check, with no transaction around it: run as it is."""
    return commit()


class TransactionalShardWriter(ShardWriter):
    """Legacy Datastore: the marker and the shard read and written in one transaction."""

    def write(self, index: int, attempts: int) -> Outcome[dict]:
        answer = {"attempts": attempts, "shard": index}

        def add_one(_: None, stamp: str) -> dict:
            key = CounterShard.key_for(self.name, index)
            shard = key.get(retries=0) or CounterShard(key=key)  # created on its first increment
            shard.count += 1
            ndb.put_multi([shard, self._marker(answer, stamp)] if self.request else [shard])
            return answer
        return once(self._look, add_one, self._counted, self.call,
                    run=lambda txn: ndb.transaction(txn, retries=0))  # one attempt: `commit_on_a_shard` retries


def shard_writer(name: str, request: idempotency.Keyed | None) -> ShardWriter:
    """The writer for this process's backend: blind increments where its Datastore applies them."""
    increments = runtime.current().datastore.increments
    if increments is None:
        return TransactionalShardWriter(name, request)
    return BlindShardWriter(name, request, increments)
