"""Writers of one hot entity queued: within a process on a lock, across processes on a lease in the cache.

Why: a transaction that reads an entity and then writes it (a blog's index, a user's comment sequence, a counter's
config, a job) collides with every other such transaction on that entity. How the collision ends depends on the
datastore:
- Firestore in Datastore mode locks pessimistically (PESSIMISTIC is the default concurrency mode of a Firestore
  database; OPTIMISTIC can be chosen per database, and OPTIMISTIC_WITH_ENTITY_GROUPS exists for databases upgraded from
  Datastore and "is not recommended": the Admin API's Database.ConcurrencyMode,
  https://cloud.google.com/datastore/docs/reference/admin/rest/Shared.Types/ConcurrencyMode). A transaction's read
  takes a lock that can delay another transaction's write until it ends
  (https://cloud.google.com/datastore/docs/concepts/transactions#transaction_locks). On the Firestore emulator two
  transactions that both read an entity and then write it both wait until a lock timeout (about 2.3 s; its bugs
  firebase-tools #8300 and #6758), after which one is aborted and tries again. That timeout is the emulator's own;
  in production a collision also costs at least a retry of the whole transaction.
- The legacy Datastore emulator (like Datastore before Firestore, and OPTIMISTIC databases) commits the first and
  aborts the rest at once: they retry, and their work so far is thrown away.
Either way, writers that take turns do better than writers that collide. A lock in the process only orders the
writers of that process; the app runs as many processes (gunicorn workers, App Engine instances), so the turns are
handed out by the cache, which every process shares: a lease per entity (memcached `add`, Redis `SET NX EX`), held
while the transaction runs and given back after.

The lease only orders writers; it guards nothing. The transaction is still the only source of truth: a writer that
runs without the lease (the cache away, frozen or bypassed, or the lease given up on after LEASE_SECONDS) or beside a
holder whose lease expired commits or aborts exactly as before. So a process that dies holding a lease costs the
others one expiry, and nothing is lost or written twice.

Checked and not chosen: a transaction that takes no read lock (read outside it, then commit with a precondition on the
version read: `Mutation.base_version`). The legacy emulator honours it; the Firestore emulator ignores it and applies
a stale write (tried here, Cloud SDK 528), so it cannot be tested where it matters.
"""
import contextlib
import hashlib
import random
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from google.cloud import ndb

if TYPE_CHECKING:
    from core.cache import Cache

# How long a lease lives if its holder never gives it back (a process that died): what its death can cost the others.
# Longer than one transaction with a retry or two, even one that met a Firestore emulator lock timeout (2.3 s).
# memcached counts expiry in whole seconds from a clock that ticks once a second: a lease of 3 lives 2 to 3 s.
LEASE_SECONDS = 3
# A waiter asks again after a short jittered sleep, doubling up to POLL_MAX: a transaction here takes 5 to 50 ms, so
# the turn is rarely waited on for long, and the cache sees a few requests per waiting process, never a storm.
POLL_FIRST, POLL_MAX = 0.002, 0.025


class HotEntities:
    """The queue of writers per hot entity, for one process. `cache`: the app's Cache; `leases` False keeps the
    queue within the process (HOT_LEASES=off: the design before the lease, kept for bench/posts.py to compare)."""

    def __init__(self, cache: "Cache", leases: bool = True) -> None:
        self.cache = cache
        self.leases = leases
        self._guard = threading.Lock()
        # a lock lives while someone holds or waits for it
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()

    def _local(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    @contextlib.contextmanager
    def turn(self, key: ndb.Key) -> Iterator[None]:
        """The block runs in this writer's turn at entity `key` (an ndb key): after this process's earlier writers
        of it, and, while the cache answers, while no other process's writer holds its lease."""
        name = _lease_name(key)
        with self._local(name):
            token = uuid.uuid4().hex.encode()
            held = self.leases and self._acquire(name, token)
            try:
                yield
            finally:
                if held:
                    self.cache.release(name, token)

    def _acquire(self, name: str, token: bytes) -> bool:
        """Wait for the lease: True once this writer holds it; False when it goes on without (no cache to ask, or the
        holder kept it past what a living holder would: LEASE_SECONDS, after which it expires anyway)."""
        deadline = time.monotonic() + LEASE_SECONDS
        pause = POLL_FIRST
        while True:
            taken = self.cache.lease(name, token, LEASE_SECONDS)
            if taken is not False:
                return bool(taken)
            if time.monotonic() >= deadline:
                return False
            time.sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, POLL_MAX)


def _lease_name(key: ndb.Key) -> str:
    """The lease's cache key: the entity's full key (project, namespace, path), hashed to fit memcached's 250 bytes."""
    return "lease:" + hashlib.sha1(key.urlsafe()).hexdigest()
