"""A counter's config, created and grown: by an admin (`increase_shards`), or by an adaptive counter itself: each
process watches its own attempts at it (`grower`) and multiplies its shards (`grow`) while they keep colliding."""
import logging
import threading
from collections.abc import Callable

from google.cloud import ndb

from core.cache import CACHE_DOWN
from core.errors import Conflict, Unavailable, Unprocessable, found
from core.transactions import in_turn, transact
from counters.models import ADAPTIVE_MAX_SHARDS, CounterConfig, validate_name, validate_num_shards

log = logging.getLogger(__name__)
DEFAULT_SHARDS = {"general": 20, "adaptive": 1}


def get_config(name: str) -> CounterConfig | None:
    return ndb.Key(CounterConfig, validate_name(name)).get()


def require_config(name: str) -> CounterConfig:
    return found(get_config(name), f"No counter is named {name!r}.", "no_such_counter")


def configure(name: str, mode: object, num_shards: object = None, listed: bool = True) -> CounterConfig:
    """Create a counter in `mode`, or, when it exists in that mode, grow it to `num_shards`; its mode never changes.
    In a transaction, so that two racing first uses cannot both create it. `listed=False`: another feature's."""
    validate_name(name)
    if not isinstance(mode, str) or mode not in DEFAULT_SHARDS:
        raise Unprocessable("mode must be 'general' or 'adaptive'.", "bad_mode")
    shards = None if num_shards is None else validate_num_shards(num_shards)

    key = ndb.Key(CounterConfig, name)

    def txn() -> CounterConfig:
        config = key.get(retries=0)
        if config is None:
            config = CounterConfig(key=key, mode=mode, num_shards=shards or DEFAULT_SHARDS[mode], listed=listed)
            config.put()
        elif config.mode != mode:
            raise Conflict(f"Counter {name!r} is {config.mode}; a counter's mode cannot change.", "mode_fixed")
        elif shards and shards > config.num_shards:
            config.num_shards = shards
            config.put()
        return config
    # Many first uses of one counter race to create it: on Firestore, transactions creating one entity wait on each
    # other's locks, so they take turns (core/hotspots.py), and one whose turn comes once it exists reads it instead.
    if num_shards is None:
        with in_turn(key):
            existing = key.get(use_global_cache=False)
        if existing is not None and existing.mode == mode:
            return existing
    return transact(txn, busy_message="The counter is being set up by many at once; try again.", hot_key=key)


def increase_shards(name: str, num_shards: object) -> CounterConfig:
    """Raise a counter's shard count to `num_shards`; never lowers it: a total sums only the shards below
    num_shards, so lowering would strand the counts in the dropped ones."""
    shards = validate_num_shards(num_shards)
    config = require_config(name)
    if shards <= config.num_shards:
        return config
    return configure(name, config.mode, shards)


class ContentionWindow:
    """Per process and per adaptive counter: how many of the last attempts collided. At least GROW_AT of the last
    WINDOW collided asks to grow, by as much as the rate says. Kept in the process: no shared entity to contend on;
    why this rule: docs/lessons/counters.md ("When an adaptive counter grows")."""
    WINDOW = 32
    # A counter of few shards is judged sooner: growing it wrongly costs a shard or two, and on one shard every retry
    # also waits its backoff, so 32 attempts there took seconds.
    ATTEMPTS_PER_SHARD = 8
    GROW_AT = 0.1  # of the attempts collided: grow

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, int, int]] = {}  # name -> (num_shards judged, attempts, collisions)

    def observe(self, name: str, num_shards: int, collided: bool) -> int:
        """Record one attempt at `num_shards`; the factor to grow by (a power of two) when the window calls for it,
        else 0."""
        with self._lock:
            size, tried, hits = self._seen.get(name, (num_shards, 0, 0))
            if num_shards < size:
                return 0  # an attempt made before the last growth says nothing about the new size
            if num_shards > size:
                size, tried, hits = num_shards, 0, 0
            tried, hits = tried + 1, hits + bool(collided)
            if tried < min(self.WINDOW, self.ATTEMPTS_PER_SHARD * size):
                self._seen[name] = (size, tried, hits)
                return 0
            rate = hits / tried
            # Grown in one step by as much as the collisions ask: a doubling at a time would take a window per step
            # while every writer kept colliding.
            factor = 1
            while rate >= self.GROW_AT * factor:
                factor *= 2
            # After a verdict, judge only attempts at the size it asks for (until `restart` says where it landed).
            self._seen[name] = (size * factor, 0, 0)
            return factor if factor > 1 else 0

    def restart(self, name: str, num_shards: int) -> None:
        """A fresh window at the size the counter has after a verdict's `grow` (the old one when it did not apply)."""
        with self._lock:
            self._seen[name] = (num_shards, 0, 0)


contention = ContentionWindow()  # the process's own


def grower(name: str) -> Callable[[int, bool], int]:
    """What an adaptive counter's increment tells of each attempt (writes.commit_on_a_shard's `grow`): heard as it
    happens, so a stuck increment grows the counter at once. Returns the shard count to go on with."""
    def grow_if_colliding(num_shards: int, collided: bool) -> int:
        factor = contention.observe(name, num_shards, collided)
        if factor:
            grown = num_shards
            try:
                grown = grow(name, num_shards, factor)
            finally:  # a fresh window at the size the counter has, even when grow raised
                contention.restart(name, grown)
            return grown
        if collided:
            # Another writer may have grown the counter since this increment began: retry over all its shards.
            # Only a committed shard count is safe to use, since a total sums the shards below it.
            return max(num_shards, require_config(name).num_shards)
        return num_shards
    return grow_if_colliding


def grow(name: str, seen_shards: int, factor: int) -> int:
    """Multiply an adaptive counter's shards by `factor`, up to the cap; the shard count to go on with. Only the first
    process to ask at a given size grows it (`seen_shards`). Best effort: one attempt; if it collides or the config
    cannot be written (the cache away: a globally cached kind), a later window asks again."""
    current = require_config(name).num_shards  # a cheap look first: another process may have grown it already
    if current != seen_shards or seen_shards >= ADAPTIVE_MAX_SHARDS:
        return current

    key = ndb.Key(CounterConfig, name)

    def txn() -> int:
        config = key.get(retries=0)
        if config.num_shards == seen_shards:
            config.num_shards = min(ADAPTIVE_MAX_SHARDS, seen_shards * factor)
            config.put()
        return config.num_shards
    try:
        # In turn with the config's other writers (creation, an admin's raise, other processes growing it), so as
        # not to wait out a lock timeout against them.
        return transact(txn, max_attempts=1, hot_key=key)
    except (Unavailable, *CACHE_DOWN) as e:  # collided (the loop's one attempt), or memcached away
        log.info("adaptive counter %s not grown this time: %r", name, e)
        return seen_shards
