"""Sharded counters: the talk's first lesson.

A counter written by many clients at once cannot be one entity: Datastore commits to one entity group at a limited
rate and aborts transactions that collide. So a counter is N shard entities; an increment adds 1 to a random shard in
a small transaction, and the total is the sum of the shards, read by key (strongly consistent, no index, no query).

Three kinds live here:
- the simple counter: the talk's fixed twenty shards, created lazily;
- named `general` counters: a CounterConfig with `num_shards`, the total cached in memcached;
- named `adaptive` counters: start with one shard and multiply them while increments keep colliding, up to a cap.
"""
import datetime
import itertools
import logging
import random
import re
import threading
import uuid
from dataclasses import dataclass

from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import runtime, validate
from core.cache import CACHE_DOWN
from core.datastore import backoff, is_contention
from core.errors import BadInput, Conflict, Forbidden, SignInRequired, Unavailable, Unprocessable, found
from core.transactions import in_turn, transact
from counters.models import AppliedIncrement, CounterConfig, CounterShard, SimpleCounterShard

log = logging.getLogger(__name__)
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,100}")
# A feature's own counters are named "<owner>:<name>". Public names cannot contain the ':' (NAME_PATTERN), so no name
# anyone can create through the public API is ever one of them, whatever features are added later.
OWNER_SEPARATOR = ":"
OWNER_PATTERN = re.compile(r"[a-z]{1,20}")
SIMPLE_SHARDS = 20
DEFAULT_SHARDS = {"general": 20, "adaptive": 1}
MAX_SHARDS = 1000
ADAPTIVE_MAX_SHARDS = 256
TOTAL_LIFETIME = 60  # seconds a cached total lives; it bounds how long a lost memcached incr can show
MAX_ATTEMPTS = 100
# One shard, nowhere else to go: wait a random time up to 0.5 s, 1 s, 2 s, then 4 s (full jitter). Measured at 32
# writers on one entity: 25 commits/s waiting up to 20 ms first, 56 up to 0.5 s first; ndb's textbook 1 s backoff,
# 40-78 in the same runs, but it gives up after 3 retries and loses increments.
SINGLE_SHARD_BACKOFF = 0.25
SINGLE_SHARD_BACKOFF_CAP = 4.0
LIST_LIMIT = 100
BURST_MAX_WRITERS = 32
BURST_MAX_INCREMENTS = 500


@dataclass
class Increment:
    applied: bool
    attempts: int  # transactions tried; more than 1 means the increment met contention
    shard: int


@dataclass
class Total:
    count: int
    cached: bool


def validate_name(name):
    """A public counter's name, or a feature's own ("<owner>:<name>", made by an OwnedCounters handle)."""
    if isinstance(name, str):
        owner, separator, rest = name.rpartition(OWNER_SEPARATOR)
        if (not separator or OWNER_PATTERN.fullmatch(owner)) and NAME_PATTERN.fullmatch(rest):
            return name
    raise BadInput("A counter name is 1 to 100 characters of letters, digits, '_', '.' and '-'.", "bad_name")


def public_name(name):
    """`name` as the public API may use it: 403 for a feature's own counter, whoever asks (an admin too: only the
    feature that owns it keeps it right), 400 for a malformed name."""
    if isinstance(name, str) and OWNER_SEPARATOR in name:
        raise Forbidden(f"Counter {name!r} is kept by the app itself; it cannot be read or changed here.",
                        "reserved_counter")
    return validate_name(name)


def validate_num_shards(value):
    return validate.whole_number(value, "num_shards", 1, MAX_SHARDS, from_json=True)


def _total_cache_key(name):
    return f"counter-total:{name}"


def _commit_on_a_shard(num_shards, attempt, on_attempt=None, max_attempts=MAX_ATTEMPTS):
    """Run `attempt(shard_index)` (one commit: see `_shard_adder`) on a random shard; on contention, another shard
    at once.

    ndb's own retry would wait (backoff from 1 s) and then try the same shard again, which is the worst move for a
    counter: any other shard is an equally good place for the +1 and is probably free right now. For the same reason
    `attempt` reads with `retries=0`: a lookup that meets a locked shard would otherwise be retried by ndb, with
    backoff, on that same shard before the collision ever reached this loop.
    With a single shard there is nowhere else to go, and retrying at once only collides again with the same writers
    (measured: a fifth of the throughput of ndb's backoff at 32 writers), so there it waits a random, growing while.
    `on_attempt(num_shards, collided)`, if given, hears of every attempt and returns the shard count to go on with.
    Returns (attempt's result, attempts made, shard used).
    """
    shard = random.randrange(num_shards)
    for attempts in range(1, max_attempts + 1):
        try:
            result = attempt(shard)
        except Exception as e:  # noqa: BLE001 - only contention is retried; anything else is re-raised
            if not is_contention(e):
                raise
            if on_attempt:
                num_shards = on_attempt(num_shards, True)
            if num_shards > 1:
                shard = (shard + random.randrange(1, num_shards)) % num_shards  # any shard but this one
            else:
                backoff(attempts, SINGLE_SHARD_BACKOFF, SINGLE_SHARD_BACKOFF_CAP)
            continue
        if on_attempt:
            on_attempt(num_shards, False)
        return result, attempts, shard
    raise Unavailable("The counter is too contended right now; try again.", "contention")


def _shard_adder(shard_key, model, total_key=None, marker_key=None):
    """attempt(index) for `_commit_on_a_shard`: +1 on shard `shard_key(index)` in one commit; True when it counted
    (False: the Idempotency-Key's marker was written before, by another call). Then memcached's cached total `incr`ed,
    only after the commit and only once (inside a retried transaction an incr could run for an attempt that then
    aborts); incr never creates the key (pymemcache returns None for a missing one): a missing total is rebuilt from
    the shards on the next read.

    Where the two backends differ (see README, "Two backends"):
    - Firestore in Datastore mode (`ServerIncrements`): a blind server-side increment, no read, so no lock to wait on.
      The marker is inserted in the same commit; if it exists, nothing was written and the marker says whose it is.
    - Legacy Datastore: a read-modify-write transaction (the legacy emulator drops server-side increments). Optimistic
      concurrency: a collision aborts at commit, at once, and the loop moves to another shard. The marker is read and
      written in the same transaction.
    `token` names this call, so its own retry after a commit of unknown outcome still answers "applied".
    """
    cache = runtime.cache()
    increments = runtime.current().datastore.increments
    token = uuid.uuid4().hex

    def counted():
        if total_key:
            cache.incr(total_key)
        return True

    def blind(index):
        marker = (marker_key, {"token": token, "created": datetime.datetime.now(datetime.UTC)}) \
            if marker_key else None
        try:
            increments.commit(shard_key(index), "count", 1, insert=marker)
        except core_exceptions.AlreadyExists:
            found = marker_key.get(use_cache=False, use_global_cache=False)
            return found is not None and found.token == token  # our own earlier attempt committed after all
        return counted()

    def transaction(index):
        def txn():
            if marker_key is not None:
                marker = marker_key.get(retries=0)
                if marker is not None:
                    return marker.token == token
                AppliedIncrement(key=marker_key, token=token).put()
            key = shard_key(index)
            shard = key.get(retries=0) or model(key=key)  # created on its first increment
            shard.count += 1
            shard.put()
            ndb.get_context().call_on_commit(counted)
            return True
        return ndb.transaction(txn, retries=0)

    return blind if increments is not None else transaction


# --- the simple counter -------------------------------------------------------------------------------------------

def _simple_key(index):
    return ndb.Key(SimpleCounterShard, f"shard-{index}")


def increment_simple():
    """Add 1 to the talk's twenty-shard counter."""
    _, attempts, shard = _commit_on_a_shard(SIMPLE_SHARDS, _shard_adder(_simple_key, SimpleCounterShard))
    return Increment(True, attempts, shard)


def simple_shard_counts():
    """The count of each of the twenty shards, read by key in one batch."""
    shards = ndb.get_multi([_simple_key(i) for i in range(SIMPLE_SHARDS)])
    return [s.count if s else 0 for s in shards]


# --- named counters -----------------------------------------------------------------------------------------------

def get_config(name):
    return ndb.Key(CounterConfig, validate_name(name)).get()


def require_config(name):
    return found(get_config(name), f"No counter is named {name!r}.", "no_such_counter")


def configure(name, mode, num_shards=None, listed=True):
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
    return transact(txn, busy_message="The counter is being set up by many at once; try again.", hot_key=key)


def increase_shards(name, num_shards):
    """Raise a counter's shard count to `num_shards`; never lowers it.

    Lowering would strand the counts in the dropped shards: a total sums only shards below num_shards.
    """
    validate_num_shards(num_shards)
    config = require_config(name)
    if num_shards <= config.num_shards:
        return config
    return configure(name, config.mode, num_shards)


def increment(name, idempotency_key=None, mode="general", listed=True, create=True):
    """Add 1 to counter `name` (created in `mode`, `listed` or not, on first use; with `create` False a counter that
    does not exist is a SignInRequired and nothing is written: the public API lets anyone add to a counter, but only
    a signed-in user create one, since an anonymous path that creates entities is a storage flood).

    With an idempotency key the increment is applied at most once however often the client retries: the marker entity
    is written in the same commit as the shard's increment, so both exist or neither does. A commit whose outcome is
    unknown (an UNKNOWN error) is retried too; without a key such a retry could count twice, with one it cannot.
    """
    validate_name(name)
    validate.idempotency_key(idempotency_key)
    config = get_config(name)
    if config is None:
        if not create:
            raise SignInRequired(f"There is no counter named {name!r}; sign in to create it.", "sign_in_to_create")
        config = configure(name, mode, listed=listed)
    marker_key = AppliedIncrement.key_for(name, idempotency_key) if idempotency_key else None
    attempt = _shard_adder(lambda index: CounterShard.key_for(name, index), CounterShard, _total_cache_key(name),
                           marker_key)

    def on_attempt(num_shards, collided):
        factor = _contention.observe(name, num_shards, collided)
        if factor:
            return _grow(name, num_shards, factor)
        if collided:
            # Another writer may have grown the counter since this increment began: retry over all its shards.
            # Only a committed shard count is safe to use, since a total sums the shards below it.
            return max(num_shards, get_config(name).num_shards)
        return num_shards

    applied, attempts, shard = _commit_on_a_shard(
        config.num_shards, attempt, on_attempt if config.mode == "adaptive" else None)
    return Increment(applied, attempts, shard)


class ContentionWindow:
    """Per process and per adaptive counter: how many of the last transaction attempts collided.

    One collision is noise; growth is for contention that lasts. Every attempt is evidence, heard as it happens (an
    increment stuck behind many collisions would report too late), so a badly contended counter fills its window in a
    fraction of a second. It grows when at least GROW_AT of the last WINDOW attempts here collided; the window then
    starts afresh at the new size, so growth stops once the shards are enough for the load. Kept in the process (no
    shared entity to contend on); each process judges from its own attempts, and the config transaction keeps their
    verdicts from adding up.
    """
    WINDOW = 32
    GROW_AT = 0.1  # of the attempts collided: double
    SURGE_AT = 0.5  # of the attempts collided: quadruple, to catch up with a burst in few steps

    def __init__(self):
        self._lock = threading.Lock()
        self._seen = {}  # name -> (num_shards the window is about, attempts, collisions)

    def observe(self, name, num_shards, collided):
        """Record one attempt at `num_shards`; the factor to grow by (2 or 4) when the window calls for it, else 0."""
        with self._lock:
            size, tried, hits = self._seen.get(name, (num_shards, 0, 0))
            if num_shards < size:
                return 0  # an attempt made before the last growth says nothing about the new size
            if num_shards > size:
                size, tried, hits = num_shards, 0, 0
            tried, hits = tried + 1, hits + bool(collided)
            if tried < self.WINDOW:
                self._seen[name] = (size, tried, hits)
                return 0
            rate = hits / tried
            factor = 4 if rate >= self.SURGE_AT else 2 if rate >= self.GROW_AT else 0
            # After a verdict, judge only attempts at the size it asks for.
            self._seen[name] = (size * (factor or 1), 0, 0)
            return factor


_contention = ContentionWindow()


def _grow(name, seen_shards, factor):
    """Multiply an adaptive counter's shards by `factor`, up to the cap; never lowers them. Returns the shard count
    to go on with.

    Only the first process to ask at a given size grows the counter (the check on `seen_shards`), so several processes
    reaching the same verdict grow it once. Best effort: if this transaction collides or the config cannot be written
    (memcached away: it is a globally cached kind), a later window asks again.
    """
    current = get_config(name).num_shards  # a cheap look first: another process may have grown it already
    if current != seen_shards or seen_shards >= ADAPTIVE_MAX_SHARDS:
        return current

    key = ndb.Key(CounterConfig, name)

    def txn():
        config = key.get()
        if config.num_shards == seen_shards:
            config.num_shards = min(ADAPTIVE_MAX_SHARDS, seen_shards * factor)
            config.put()
        return config.num_shards
    try:
        # In turn with the config's other writers (creation, an admin's raise, other processes growing it), so as
        # not to wait out a lock timeout against them; one attempt only, as said above.
        with in_turn(key):
            return ndb.transaction(txn, retries=0)
    except Exception as e:  # noqa: BLE001 - collided, or memcached away: a later window asks again
        if not (is_contention(e) or isinstance(e, CACHE_DOWN)):
            raise
        log.info("adaptive counter %s not grown this time: %r", name, e)
        return seen_shards


class Alongside:
    """Other keys a page reads by key, sent in the same Datastore batch as the next shard read: ndb sends every key
    asked for in one turn of its event loop as one Lookup, so asking for these just before the shards makes one round
    trip of what would be two (the counters page: its counters' shards and the simple counter's)."""

    def __init__(self, keys):
        self.keys = keys
        self._futures = None

    def start(self):
        if self._futures is None:
            self._futures = ndb.get_multi_async(self.keys)

    def results(self):
        self.start()  # no shard read happened (nothing to sum): read them alone
        return [f.result() for f in self._futures]


def shard_counts_many(configs, alongside=None):
    """Each shard's count for each counter, all read by key in one batch: strongly consistent (unlike a query on a
    counter-name property), and one round trip however many counters a page shows (`alongside`'s keys included)."""
    keys = [CounterShard.key_for(c.name, i) for c in configs for i in range(c.num_shards)]
    if alongside is not None:
        alongside.start()
    shards = iter(ndb.get_multi(keys))
    return [[s.count if s else 0 for s in itertools.islice(shards, c.num_shards)] for c in configs]


def shard_counts(config):
    return shard_counts_many([config])[0]


def _cached_totals(names, configs=None, with_shards=False, alongside=None):
    """{name: (Total, shard counts or None)}, the one reader of cached totals: the cached ones in one memcached round
    trip, the rest summed from their shards in one Datastore batch (by key: strongly consistent, no query) and then
    cached. `configs` ({name: config or None}) when the caller has them; else the missing ones are read by key in one
    batch. `with_shards` reads every counter's shards in that batch, and missing totals come from the same read.

    A counter that was never created counts 0, and that 0 is cached too: otherwise every page listing entries without
    comments would ask Datastore for the missing configs again (ndb's global cache does not keep misses). Its first
    increment incrs the cached 0 after committing, as for any cached total.

    `add`, not `set`: a total another reader cached meanwhile has since received increments of its own; overwriting it
    with ours would lose them. The cached total is the talk's trade: an increment whose commit lands between a reader's
    shard read and its `add`, or whose `incr` is lost to a frozen memcached, is missing from the cached value until it
    expires, at most TOTAL_LIFETIME. Reads that must be exact use `shard_counts` or `exact_totals`.
    """
    cache = runtime.cache()
    keys = {name: _total_cache_key(name) for name in names}
    cached = cache.get_many(list(keys.values()))
    to_sum = [n for n in names if with_shards or keys[n] not in cached]
    if configs is None:
        found = ndb.get_multi([ndb.Key(CounterConfig, n) for n in to_sum]) if to_sum else []
        configs = dict(zip(to_sum, found, strict=True))
    existing = [configs[n] for n in to_sum if configs.get(n) is not None]
    shards = dict(zip((c.name for c in existing), shard_counts_many(existing, alongside), strict=True))
    result = {}
    for name in names:
        if keys[name] in cached:
            total = Total(int(cached[keys[name]]), True)
        else:
            total = Total(sum(shards.get(name, ())), False)
            cache.add(keys[name], total.count, expire=TOTAL_LIFETIME)
        result[name] = (total, shards.get(name) if with_shards else None)
    return result


def get_total(name, config=None):
    """The counter's total: from memcached when cached, else the sum of its shards (then cached for a minute).
    Without `config`, the config is read only when the total is not cached (and then, like any counter a total is
    asked of, one that was never created counts 0)."""
    return _cached_totals([validate_name(name)], None if config is None else {name: config})[name][0]


def exact_totals(names):
    """{name: total} summed from the shards, never from the cache, 0 for a counter never created: for a repair job
    that compares a counter with the truth."""
    configs = [c for c in ndb.get_multi([ndb.Key(CounterConfig, n) for n in names]) if c is not None]
    summed = {c.name: sum(counts) for c, counts in zip(configs, shard_counts_many(configs), strict=True)}
    return {n: summed.get(n, 0) for n in names}


def list_counters(limit=LIST_LIMIT, with_shards=False, alongside=None):
    """The first `limit` public counters by name as (config, total, shard counts or None), totals as
    `_cached_totals` reads them.

    A query, eventually consistent: a counter created a moment ago may be missing from the list for a moment. Equality
    on one property ordered by key needs no composite index: the property's built-in index is sorted that way.
    A feature's own counters are created unlisted; the name check keeps them out even if one ever were not.
    """
    configs = [c for c in CounterConfig.query(CounterConfig.listed == True).order(CounterConfig.key).fetch(limit)  # noqa: E712
               if OWNER_SEPARATOR not in c.name]
    totals = _cached_totals([c.name for c in configs], {c.name: c for c in configs}, with_shards, alongside)
    return [(c, *totals[c.name]) for c in configs]


def counters_page(limit=LIST_LIMIT):
    """What the counters page shows: the public counters with every shard (list_counters) and the simple counter's
    twenty shards, all the shards read in one Datastore batch."""
    simple = Alongside([_simple_key(i) for i in range(SIMPLE_SHARDS)])
    counters = list_counters(limit, with_shards=True, alongside=simple)
    return counters, [s.count if s else 0 for s in simple.results()]


class OwnedCounters:
    """A feature's own counters (an entry's views, its comments), under the reserved name "<owner>:<name>".

    The feature that owns them is the only writer: the public API refuses their names (403) and never lists them, so
    nobody can forge an entry's comment count. Adaptive and unlisted: most are written rarely (one shard) and a few by
    many at once (they grow). Everything here takes and returns the feature's own short names.
    """

    def __init__(self, owner):
        if not OWNER_PATTERN.fullmatch(owner):
            raise ValueError(f"an owner is 1 to 20 lowercase letters, not {owner!r}")
        self.prefix = f"{owner}{OWNER_SEPARATOR}"

    def name(self, short):
        """The counter's full name; `short` is the feature's own (e.g. "demo.59.views")."""
        return validate_name(self.prefix + short)

    def increment(self, short):
        """+1, best effort: True if it counted. A count that cannot be made now (the counter's first increment while
        memcached is away, since configs are a globally cached kind; contention beyond the retries) is logged and
        skipped, never an error for the reader or writer whose request it rides on."""
        name = self.name(short)
        try:
            increment(name, mode="adaptive", listed=False)
            return True
        except (Unavailable, *CACHE_DOWN) as e:
            log.warning("counter %s not incremented: %r", name, e)
            return False

    def totals(self, shorts):
        """{short: total}, 0 for a counter never created; cached totals (see `_cached_totals`)."""
        names = {short: self.name(short) for short in shorts}
        found = _cached_totals(list(names.values()))
        return {short: found[name][0].count for short, name in names.items()}

    def exact_totals(self, shorts):
        """{short: total} summed from the shards, never from the cache."""
        names = {short: self.name(short) for short in shorts}
        found = exact_totals(list(names.values()))
        return {short: found[name] for short, name in names.items()}

    def configure(self, short, num_shards):
        """Create the counter with `num_shards` shards when it does not exist (or grow it to that many): for one
        that many transactions will add to at once (`add_in_transaction`), which must not race to create it."""
        return configure(self.name(short), "adaptive", num_shards, listed=False)

    def add_in_transaction(self, short, delta):
        """Inside the caller's transaction: add `delta` (negative too) to a random one of the counter's shards,
        creating the counter (one shard) when it does not exist. Returns the entities for the caller to put with its
        own; the cached total is dropped once the transaction commits. Two entity groups (config and shard): the
        caller's transaction must have room for them. The shard is random so that many transactions adding at once
        (a mapper's chunks) rarely meet on one; they commit or abort with the caller's writes, so no add is lost or
        made twice."""
        name = self.name(short)
        # retries=0, as in `attempt`: a lookup that meets a shard locked by another transaction fails at once, and the
        # caller's `transact` retries the whole transaction after a short jittered wait (ndb's own retry of the lookup
        # waits 1 s, then 2, then 4: most of a mapper delivery's time on the legacy emulator).
        config = ndb.Key(CounterConfig, name).get(retries=0)
        writes = []
        if config is None:
            config = CounterConfig(id=name, mode="adaptive", num_shards=DEFAULT_SHARDS["adaptive"], listed=False)
            writes.append(config)
        key = CounterShard.key_for(name, random.randrange(config.num_shards))
        shard = key.get(retries=0) or CounterShard(key=key)
        shard.count += delta
        writes.append(shard)
        ndb.get_context().call_on_commit(lambda: runtime.cache().delete(_total_cache_key(name)))
        return writes


def owned(owner):
    """The handle through which the feature `owner` keeps its own counters."""
    return OwnedCounters(owner)


def burst(name, writers, increments):
    """`increments` increments of counter `name` from `writers` threads at once: contention on demand, so a person can
    watch an adaptive counter grow. Each thread has its own ndb context, as each request would.
    Returns (increments, attempts, num_shards afterwards)."""
    validate.whole_number(writers, "writers", 1, BURST_MAX_WRITERS, from_json=True)
    validate.whole_number(increments, "increments", 1, BURST_MAX_INCREMENTS, from_json=True)
    require_config(name)
    shares = [increments // writers + (1 if i < increments % writers else 0) for i in range(writers)]
    batches = runtime.current().map_in_threads(
        lambda count: [increment(name).attempts for _ in range(count)], shares)
    attempts = [a for batch in batches for a in batch]
    return len(attempts), sum(attempts), get_config(name).num_shards
