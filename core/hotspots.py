"""Writers of one hot entity take turns: within a process on a lock, across processes on a claim in the cache. Writers
that take turns do better than transactions that collide; the claim only orders writers and guards nothing: the
transaction stays the only source of truth (docs/lessons/blog.md, "Turns at a hot entity").
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

# How long a claim lives if its holder died: longer than one transaction with a retry or two, even one that met a
# Firestore emulator lock timeout (2.3 s). memcached counts expiry in whole seconds: a claim of 3 lives 2 to 3 s.
CLAIM_SECONDS = 3
# A waiter asks again after a short jittered sleep, doubling up to POLL_MAX: a turn takes about 80 ms at production's
# medians, so it asks a few times a turn; only the first of each process's waiters asks (the others wait locally).
POLL_FIRST, POLL_MAX = 0.002, 0.025


class HotEntities:
    """The queue of writers per hot entity, for one process. `cache`: the app's Cache; `claims` False keeps the
    queue within the process (the design before the claim, which bench/posts.py compares)."""

    def __init__(self, cache: "Cache", claims: bool = True) -> None:
        self.cache = cache
        self.claims = claims
        self._guard = threading.Lock()
        # a lock lives while someone holds or waits for it
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()

    @contextlib.contextmanager
    def turn(self, key: ndb.Key) -> Iterator[None]:
        """The block runs in this writer's turn at entity `key` (an ndb key): after this process's earlier writers
        of it, and, while the cache answers, while no other process's writer holds its claim."""
        name = _claim_name(key)
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            token = uuid.uuid4().hex.encode()
            held = self.claims and self._acquire(name, token)
            try:
                yield
            finally:
                if held:
                    self.cache.release(name, token)

    def _acquire(self, name: str, token: bytes) -> bool:
        """Wait for the claim: True once this writer holds it; False when it goes on without (no cache to ask, or the
        holder kept it past what a living holder would: CLAIM_SECONDS, after which it expires anyway)."""
        deadline = time.monotonic() + CLAIM_SECONDS
        pause = POLL_FIRST
        while True:
            taken = self.cache.add(name, token, CLAIM_SECONDS)  # False: another writer holds it
            if taken is not False:
                return taken is True  # None: no cache to ask
            if time.monotonic() >= deadline:
                return False
            time.sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, POLL_MAX)


def _claim_name(key: ndb.Key) -> str:
    """The claim's cache key: the entity's full key (project, namespace, path), hashed to fit memcached's 250 bytes."""
    return "claim:" + hashlib.sha1(key.urlsafe()).hexdigest()
