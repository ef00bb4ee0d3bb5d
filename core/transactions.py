"""Transactions as the app runs them: one retry loop for every commit that can collide. A commit may answer UNKNOWN
(or time out) after it applied: core/exactly_once.py is how a write still happens once.

- `retried(attempt, on_collision)`: run `attempt` again when it collides (ABORTED, or the emulator's UNKNOWN) or
  when its commit's fate is unknown (DEADLINE_EXCEEDED, UNAVAILABLE: a few times only), calling `on_collision` before
  each new try: by default a jittered backoff; a sharded counter passes a policy that moves to another shard instead
  (counters/writes.py).
- `transact(fn)`: `fn` in a transaction through that loop, taking its turn at a hot entity first (core/hotspots.py);
  `transact_api(fn)` the same on the Datastore API itself, for bulk work (core/datastore.Bulk).
"""
import contextlib
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import costs, runtime
from core.errors import Unavailable

T = TypeVar("T")

# What Datastore answers when transactions collide: ABORTED, and from the emulator sometimes UNKNOWN. UNKNOWN may have
# applied too (hence core/exactly_once.py), but it is the emulator's word for a collision from a Datastore that is up,
# so it is retried as one (up to max_attempts), not only the few times below, kept few for a Datastore that is away.
CONTENTION_ERRORS = (core_exceptions.Aborted, core_exceptions.Unknown)
# What a call answers when Datastore did not answer it in time or could not be reached: a commit sent may have applied
# all the same (the request arrived, its answer did not), as after UNKNOWN, so it is tried again (its retry finds its
# own stamp: core/exactly_once.py); but only a few times, since these also mean a Datastore that is away (503 soon).
MAYBE_APPLIED_ERRORS = (core_exceptions.DeadlineExceeded, core_exceptions.ServiceUnavailable)
MAYBE_APPLIED_ATTEMPTS = 3
BUSY = "This is too busy right now; try again."


def is_contention(error: BaseException) -> bool:
    """True when `error` means "collided, try the transaction again". ndb retries a failing RPC itself and then
    raises RetryError with the last error as its cause: contention when that cause is, but when it is an unreachable
    Datastore, retrying whole transactions would only make the user wait longer for the 503."""
    if isinstance(error, core_exceptions.RetryError):
        error = error.cause
    return isinstance(error, CONTENTION_ERRORS)


def maybe_applied(error: BaseException) -> bool:
    """True when `error` is a call's own DEADLINE_EXCEEDED or UNAVAILABLE (not ndb's RetryError after its own
    retries): a commit that answers so may have applied, and its retry must find out (core/exactly_once.py)."""
    return isinstance(error, MAYBE_APPLIED_ERRORS)


def backoff(attempt: int, base: float, cap: float) -> None:
    """Sleep a random while up to base * 2**attempt, at most `cap` seconds ("full jitter"): writers that collided
    together must not all come back together."""
    time.sleep(random.uniform(0, min(base * 2 ** attempt, cap)))


def retried(attempt: Callable[[], T], on_collision: Callable[[int], None], max_attempts: int = 30,
            busy_message: str = BUSY) -> T:
    """`attempt()`, tried again after `on_collision(n)` (n: collisions so far, from 0) each time it collides;
    Unavailable (503) when contention outlasts `max_attempts`. A commit whose fate is unknown (`maybe_applied`) is
    tried again too, up to MAYBE_APPLIED_ATTEMPTS times in all, and then raised (a 503): the retry, the same call,
    answers by what it finds. Anything else is raised at once."""
    unknown_fates = 0
    for collisions in range(max_attempts):
        try:
            return attempt()
        except Exception as e:  # noqa: BLE001 - only contention and unknown fates are retried; the rest is re-raised
            if maybe_applied(e):
                unknown_fates += 1
                if unknown_fates >= MAYBE_APPLIED_ATTEMPTS:
                    raise
            elif not is_contention(e):
                raise
        if collisions + 1 == max_attempts:
            break  # no wait before the 503
        cost = costs.current()
        if cost is not None:  # a collision, shown in the request's Server-Timing (appstats.accounting)
            cost.add_retry()
        on_collision(collisions)
    raise Unavailable(busy_message, "contention")


def transact(fn: Callable[[], T], max_attempts: int = 30, base: float = 0.02, cap: float = 1.0,
             busy_message: str = BUSY, hot_key: ndb.Key | None = None) -> T:
    """fn() in a transaction, tried again on contention after a jittered backoff. ndb's own retry waits from 1 s, a
    poor tail for a short transaction on a busy group. `hot_key`: the entity many requests write at once (a blog's
    index, a user's sequence, a counter's config, a job): each attempt first waits for its turn at it (`in_turn`).
    A commit can answer UNKNOWN and yet have applied, so `fn` must be safe to run again after its own success: it goes
    through core/exactly_once.py, or is idempotent by state (docs/lessons/exactly-once.md)."""
    def attempt() -> T:
        with in_turn(hot_key):
            return ndb.transaction(fn, retries=0)
    return retried(attempt, lambda n: backoff(n, base, cap), max_attempts, busy_message)


def transact_api(fn: Callable[[Any], T], max_attempts: int = 30, base: float = 0.02, cap: float = 1.0) -> T:
    """fn(transaction) in a transaction of the Datastore API itself (core/datastore.Bulk: its entities as
    protobufs), tried again on contention as `transact` does. fn commits it (or writes nothing), and must be safe to
    run again after its own success, as `transact`'s."""
    bulk = runtime.current().datastore.bulk
    return retried(lambda: bulk.run(fn), lambda n: backoff(n, base, cap), max_attempts)


def in_turn(hot_key: ndb.Key | None) -> contextlib.AbstractContextManager:
    """A block that runs in its turn among the writers of entity `hot_key` across the app's processes (nothing to wait
    for when it is None)."""
    if hot_key is None:
        return contextlib.nullcontext()
    return runtime.current().hot_entities.turn(hot_key)
