"""Adaptive counters grow: each process watches its own transaction attempts on a counter (ContentionWindow), and
multiplies the counter's shards (`grow`) while they keep colliding, up to ADAPTIVE_MAX_SHARDS."""
import logging
import threading

from google.cloud import ndb

from core.cache import CACHE_DOWN
from core.datastore import is_contention
from core.transactions import in_turn
from counters.configs import get_config
from counters.models import CounterConfig

log = logging.getLogger(__name__)
ADAPTIVE_MAX_SHARDS = 256


class ContentionWindow:
    """Per process and per adaptive counter: how many of the last transaction attempts collided.

    One collision is noise; growth is for contention that lasts. Every attempt is evidence, heard as it happens (an
    increment stuck behind many collisions would report too late), so a badly contended counter fills its window in a
    fraction of a second. It grows when at least GROW_AT of the last WINDOW attempts here collided, by as much as the
    collisions say: an attempt collides about as often as the writers in flight outnumber the shards, so a rate of
    collisions k times GROW_AT asks for k times the shards (rounded up to a power of two). The window then starts
    afresh at the new size, so growth stops once the shards are enough for the load. Kept in the process (no
    shared entity to contend on); each process judges from its own attempts, and the config transaction keeps their
    verdicts from adding up.
    """
    WINDOW = 32
    # A counter of few shards is judged sooner: growing it wrongly costs a shard or two, and on one shard every retry
    # also waits its backoff, so 32 attempts there took seconds.
    ATTEMPTS_PER_SHARD = 8
    GROW_AT = 0.1  # of the attempts collided: grow

    def __init__(self):
        self._lock = threading.Lock()
        self._seen = {}  # name -> (num_shards the window is about, attempts, collisions)

    def observe(self, name, num_shards, collided):
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
            # Growing a step at a time took 7 s to reach 128 shards for 32 commenters under LATENCY=production, each
            # step a window of its own, while every writer kept colliding.
            factor = 1
            while rate >= self.GROW_AT * factor:
                factor *= 2
            factor = factor if factor > 1 else 0
            # After a verdict, judge only attempts at the size it asks for.
            self._seen[name] = (size * (factor or 1), 0, 0)
            return factor


contention = ContentionWindow()  # the process's own


def grow(name, seen_shards, factor):
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
        config = key.get(retries=0)
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
