"""Reading counters: shard counts by key in one batch, totals from the cache (or summed from the shards and then
cached), the public list, and the counters page's one round trip."""
import itertools
from dataclasses import dataclass

from google.cloud import ndb

from core import runtime
from counters import simple
from counters.models import (
    MAX_SHARDS,
    OWNER_SEPARATOR,
    CounterConfig,
    CounterShard,
    shard_view_cache_key,
    total_cache_key,
    validate_name,
)

SHARD_VIEW_LIFETIME = 5  # seconds the cached copy of a counter's shard counts lives (read by all but admins)
SIMPLE_VIEW_KEY = "simple-counter-shards"  # not shard_view_cache_key: a public counter may be named "simple"
LIST_LIMIT = 100
PAGE_COUNTERS = 10  # counters on one view of the counters page
PAGE_SHARDS = MAX_SHARDS  # shards one view reads at most: one counter's most, so every counter can be drawn


@dataclass
class Total:
    count: int
    cached: bool


def shard_counts_many(configs: list[CounterConfig]) -> list[list[int]]:
    """Each shard's count for each counter, all read by key in one batch: strongly consistent (unlike a query on a
    counter-name property), and one round trip however many counters a page shows."""
    keys = [CounterShard.key_for(c.name, i) for c in configs for i in range(c.num_shards)]
    shards = iter(ndb.get_multi(keys))
    return [[s.count if s else 0 for s in itertools.islice(shards, c.num_shards)] for c in configs]


def shard_counts_of(config: CounterConfig) -> list[int]:
    """Each shard's count of a named counter (simple.shard_counts: the simple counter's)."""
    return shard_counts_many([config])[0]


def cached_totals(names: list[str], configs: dict | None = None, with_shards: bool = False,
                  shards_from_cache: bool = False) -> dict[str, tuple[Total, list[int] | None]]:
    """{name: (Total, shard counts or None)}, the one reader of cached totals: the cached ones in one cache round
    trip, the rest summed from their shards in one Datastore batch and then cached (`add`, not `set`: never overwrite
    a total that incrs have moved on). A counter never created counts 0. `with_shards` reads every counter's shards;
    `shards_from_cache` (everyone but an admin) takes them from a copy cached SHARD_VIEW_LIFETIME, since each shard is
    a billed read. The trade-offs: docs/lessons/counters.md ("Caching trade-offs")."""
    cache = runtime.cache()
    keys = {name: total_cache_key(name) for name in names}
    views = {}  # name -> the key of its cached shard view, when the shards may come from one
    if with_shards and shards_from_cache and configs is not None:
        views = {n: shard_view_cache_key(n, configs[n].num_shards) for n in names if configs.get(n) is not None}
    cached = cache.get_many([*keys.values(), *views.values()])
    to_sum = [n for n in names if keys[n] not in cached or (with_shards and views.get(n) not in cached)]
    if configs is None:
        read = ndb.get_multi([ndb.Key(CounterConfig, n) for n in to_sum]) if to_sum else []
        configs = dict(zip(to_sum, read, strict=True))
    existing = [configs[n] for n in to_sum if configs.get(n) is not None]
    shards = dict(zip((c.name for c in existing), shard_counts_many(existing), strict=True))
    result = {}
    for name in names:
        if keys[name] in cached:
            total = Total(int(cached[keys[name]]), True)
        else:
            total = Total(sum(shards.get(name, ())), False)
            cache.add(keys[name], total.count, expire=simple.TOTAL_LIFETIME)
        counts = shards.get(name) if with_shards else None
        if name in views:
            if counts is None:
                counts = [int(n) for n in cached[views[name]].split(b",")]
            else:
                cache.add(views[name], ",".join(map(str, counts)), expire=SHARD_VIEW_LIFETIME)
        result[name] = (total, counts)
    return result


def simple_shard_counts(exactly: bool) -> list[int]:
    """The simple counter's twenty shards: read (an admin's view), or else from a copy kept SHARD_VIEW_LIFETIME."""
    if exactly:
        return simple.shard_counts()
    return runtime.cache().kept_copy(SIMPLE_VIEW_KEY, SHARD_VIEW_LIFETIME, simple.shard_counts)


def total_and_shards(config: CounterConfig, shards_from_cache: bool = False) -> tuple[Total, list[int]]:
    """A counter's cached total and each shard's count (`cached_totals`)."""
    total, counts = cached_totals([config.name], {config.name: config}, True, shards_from_cache)[config.name]
    return total, counts or []


def get_total(name: str, config: CounterConfig | None = None) -> Total:
    """The counter's total (`cached_totals`); without `config`, it is read only when the total is not cached."""
    return cached_totals([validate_name(name)], None if config is None else {name: config})[name][0]


def exact_totals(names: list[str]) -> dict[str, int]:
    """{name: total} summed from the shards, never from the cache, 0 for a counter never created: for a repair job
    that compares a counter with the truth."""
    configs = [c for c in ndb.get_multi([ndb.Key(CounterConfig, n) for n in names]) if c is not None]
    summed = {c.name: sum(counts) for c, counts in zip(configs, shard_counts_many(configs), strict=True)}
    return {n: summed.get(n, 0) for n in names}


def _listed_configs(limit: int, after: str | None = None) -> list[CounterConfig]:
    """The first `limit` public counters' configs by name (after `after`). A query, eventually consistent: a counter
    created a moment ago may be missing for a moment. Equality on one property ordered by key needs no composite
    index: the property's built-in index is sorted that way."""
    query = CounterConfig.query(CounterConfig.listed == True)  # noqa: E712
    if after is not None:
        query = query.filter(CounterConfig.key > ndb.Key(CounterConfig, after))
    return [c for c in query.order(CounterConfig.key).fetch(limit) if OWNER_SEPARATOR not in c.name]


def list_counters(limit: int = LIST_LIMIT, with_shards: bool = False) -> list[tuple]:
    """The first `limit` public counters by name as (config, total, shard counts or None)."""
    configs = _listed_configs(limit)
    totals = cached_totals([c.name for c in configs], {c.name: c for c in configs}, with_shards)
    return [(c, *totals[c.name]) for c in configs]


@dataclass
class CountersPage:
    counters: list[tuple]  # (config, total, shard counts) of each counter shown
    simple: list[int]  # the simple counter's twenty shards
    next: str | None  # the name to show the next page after; None on the last page


def counters_page(after: str | None = None, shards_from_cache: bool = False) -> CountersPage:
    """What the counters page shows: public counters by name after `after`, each with every shard drawn, and the
    simple counter's shards. Bounded, since anyone may load it: PAGE_COUNTERS counters and PAGE_SHARDS of their shards
    at most (a page always shows one). An admin's view reads every shard in one Datastore batch: the simple shards are
    asked for (not awaited) after the configs' query, so ndb sends them in the same Lookup as the counters' shards.
    Anyone else's (`shards_from_cache`) takes them from copies seconds old."""
    if after is not None:
        validate_name(after)
    configs = _listed_configs(PAGE_COUNTERS + 1, after)
    simple_shards = None if shards_from_cache else ndb.get_multi_async(
        [simple.shard_key(i) for i in range(simple.SHARDS)])
    shown: list[CounterConfig] = []
    drawn = 0
    for config in configs[:PAGE_COUNTERS]:
        if shown and drawn + config.num_shards > PAGE_SHARDS:
            break
        shown.append(config)
        drawn += config.num_shards
    more = len(shown) < len(configs)
    totals = cached_totals([c.name for c in shown], {c.name: c for c in shown}, True, shards_from_cache)
    simple_counts = (simple_shard_counts(exactly=False) if simple_shards is None
                     else [s.count if s else 0 for s in (f.result() for f in simple_shards)])
    return CountersPage([(c, *totals[c.name]) for c in shown], simple_counts, shown[-1].name if more else None)
