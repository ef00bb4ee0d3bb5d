"""Transactions as the app runs them: retried on contention with jittered backoff, and, on an entity many requests
write at once, run in turn with that entity's other writers in every process (core/hotspots.py)."""
import contextlib
from collections.abc import Callable
from typing import TypeVar

from google.cloud import ndb

from core import costs, runtime
from core.datastore import backoff, is_contention
from core.errors import Unavailable

T = TypeVar("T")


def transact(fn: Callable[[], T], max_attempts: int = 30, base: float = 0.02, cap: float = 1.0,
             busy_message: str = "This is too busy right now; try again.", hot_key: ndb.Key | None = None) -> T:
    """fn() in a transaction, tried again on contention after a jittered backoff; Unavailable (503) when contention
    outlasts `max_attempts`. ndb's own retry waits from 1 s, a poor tail for a short transaction on a busy group.
    `hot_key`: the entity many requests write at once (a blog's index, a user's sequence, a counter's config, a job):
    each attempt waits for its turn at it (`in_turn`).

    A commit can fail as UNKNOWN and yet have applied, so `fn` must be safe to run again after its own success: write a
    marker in the same transaction and look for it first (see blog.service.post_entry).
    """
    for attempt in range(max_attempts):
        with in_turn(hot_key):
            try:
                return ndb.transaction(fn, retries=0)
            except Exception as e:  # noqa: BLE001 - only contention is retried; anything else is re-raised
                if not is_contention(e):
                    raise
        cost = costs.current()
        if cost is not None:  # a collision, shown in the request's Server-Timing (appstats.accounting)
            cost.add_retry()
        backoff(attempt, base, cap)
    raise Unavailable(busy_message, "contention")


def in_turn(hot_key: ndb.Key | None) -> contextlib.AbstractContextManager:
    """A block that runs in its turn among the writers of entity `hot_key` across the app's processes (nothing to wait
    for when it is None)."""
    if hot_key is None:
        return contextlib.nullcontext()
    return runtime.current().hot_entities.turn(hot_key)
