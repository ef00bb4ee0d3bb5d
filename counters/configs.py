"""A named counter's config (CounterConfig: its mode and its number of shards): read, created, grown."""
from google.cloud import ndb

from core.errors import Conflict, Unprocessable, found
from core.transactions import in_turn, transact
from counters.models import CounterConfig
from counters.names import validate_name, validate_num_shards

DEFAULT_SHARDS = {"general": 20, "adaptive": 1}


def get_config(name: str) -> CounterConfig | None:
    return ndb.Key(CounterConfig, validate_name(name)).get()


def require_config(name: str) -> CounterConfig:
    return found(get_config(name), f"No counter is named {name!r}.", "no_such_counter")


def configure(name: str, mode: str, num_shards: int | None = None, listed: bool = True) -> CounterConfig:
    """Create a counter in `mode`, or, when it exists in that mode, grow it to `num_shards`.
    `listed=False` keeps a counter that another feature keeps (an entry's views) off the counters page and list.

    Created in a transaction so that two first uses racing each other cannot both create it (get_or_insert outside
    a transaction races). A counter's mode is fixed at creation: changing it is a Conflict.
    """
    validate_name(name)
    if mode not in DEFAULT_SHARDS:
        raise Unprocessable("mode must be 'general' or 'adaptive'.", "bad_mode")
    if num_shards is not None:
        validate_num_shards(num_shards)

    key = ndb.Key(CounterConfig, name)

    def txn():
        config = key.get(retries=0)
        if config is None:
            config = CounterConfig(key=key, mode=mode, num_shards=num_shards or DEFAULT_SHARDS[mode], listed=listed)
            config.put()
        elif config.mode != mode:
            raise Conflict(f"Counter {name!r} is {config.mode}; a counter's mode cannot change.", "mode_fixed")
        elif num_shards and num_shards > config.num_shards:
            config.num_shards = num_shards
            config.put()
        return config
    # Many first uses of one counter race to create it (every commenter on a new entry): on Firestore, transactions
    # creating one entity at once wait on each other's locks, so they take turns across processes (core/hotspots.py).
    # A first use whose turn comes once the counter exists finds it with one lookup, not a transaction: 32 commenters
    # on a new entry waited 2.5 s under LATENCY=production, each for the others' transactions.
    if num_shards is None:
        with in_turn(key):
            existing = key.get(use_global_cache=False)
        if existing is not None and existing.mode == mode:
            return existing
    return transact(txn, busy_message="The counter is being set up by many at once; try again.", hot_key=key)


def increase_shards(name: str, num_shards: int) -> CounterConfig:
    """Raise a counter's shard count to `num_shards`; never lowers it.

    Lowering would strand the counts in the dropped shards: a total sums only shards below num_shards.
    """
    validate_num_shards(num_shards)
    config = require_config(name)
    if num_shards <= config.num_shards:
        return config
    return configure(name, config.mode, num_shards)
