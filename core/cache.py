"""The cache: memcached (pymemcache, the talk's) or Redis/Valkey (redis-py), one client per process shared by ndb's
global cache and the app's own caching, behind one interface (`Cache`).

Memorystore for Memcached takes no new instances after 2027-02-01 and shuts down 2029-01-31; Memorystore for Valkey
speaks the Redis protocol, so the same app runs on either (settings: MEMCACHED_HOSTS or REDIS_URL).

The cache is an accelerator, never a source of truth: every helper here treats an unreachable or frozen server as a
miss (bounded by the timeouts below), so a cache outage slows the site down instead of taking it down.
"""
import contextvars
import logging

import pymemcache
import redis
from google.cloud import ndb
from redis.backoff import NoBackoff
from redis.retry import Retry

from core.appstats import CountedClient

log = logging.getLogger(__name__)
# What a cache call raises when the server is down, frozen or refuses: OSError covers memcached's refused connections
# and timeouts, MemcacheError its protocol's failures, RedisError every redis-py failure (connection, timeout, reply).
CACHE_DOWN = (OSError, pymemcache.exceptions.MemcacheError, redis.RedisError)

CONNECT_TIMEOUT = 0.25  # seconds; loopback or same-zone Memorystore answers in well under a millisecond
IO_TIMEOUT = 0.25
POOL_SIZE = 32  # one connection per concurrent request thread is plenty
# True while a request runs as if there were no cache (Runtime.cache_bypassed): every call below a miss or a no-op.
BYPASSED = contextvars.ContextVar("cache_bypassed", default=False)


def make_client(settings):
    """A thread-safe client for the cache the settings name (memcached hosts or a Redis URL), or None for none."""
    if settings.redis_url:
        return RedisClient(settings.redis_url)
    if settings.memcached_hosts:
        return _memcached_client(settings.memcached_hosts)
    return None


class _DeleteIf:
    """memcached's text protocol has no compare-and-delete: a get, then a delete when the value is still ours. Between
    the two another caller can only have stored the key if it had expired first (see core/hotspots.py for why that
    is harmless there). Two round trips, counted as one call."""

    def delete_if(self, key, value):
        return self.get(key) == value and self.delete(key, noreply=False)


class MemcachedClient(_DeleteIf, pymemcache.PooledClient):
    """One memcached server, a pool of connections."""


class MemcachedHashClient(_DeleteIf, pymemcache.HashClient):
    """Several memcached servers, keys spread by rendezvous hash."""


def _memcached_client(hosts):
    servers = [_parse(h) for h in hosts]
    common = {"connect_timeout": CONNECT_TIMEOUT, "timeout": IO_TIMEOUT, "max_pool_size": POOL_SIZE,
              "default_noreply": False}  # noreply would hide a failed write: we want to know
    if len(servers) == 1:
        return MemcachedClient(servers[0], **common)
    # A dead server is retried after 5 s.
    return MemcachedHashClient(servers, use_pooling=True, retry_attempts=1, retry_timeout=1, dead_timeout=5,
                               **common)


def _parse(host):
    name, _, port = host.rpartition(":")
    if not name or not port.isdigit():
        raise ValueError(f"memcached host must be host:port, got {host!r}")
    return name, int(port)


# INCRBY creates a missing key at 0; memcached's incr does not, and the callers rely on that (a missing counter total
# is rebuilt from the shards, never started from one increment). One script, so the check and the add are atomic.
_INCR_IF_PRESENT = "if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) end"
_DELETE_IF = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class RedisClient:
    """Redis/Valkey with pymemcache's method names and answers, so `Cache` and the tests speak to either alike.
    `redis` is the redis-py client itself, for ndb's RedisCache."""

    def __init__(self, url):
        # One retry, on a broken connection only: a pooled connection to a server that restarted fails once and is
        # replaced. A timeout (frozen server) is not retried: that would double the wait on every call.
        self.redis = redis.Redis.from_url(
            url, socket_timeout=IO_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)))
        self._incr = self.redis.register_script(_INCR_IF_PRESENT)
        self._delete_if = self.redis.register_script(_DELETE_IF)

    def get(self, key):
        return self.redis.get(key)

    def get_many(self, keys):
        return {k: v for k, v in zip(keys, self.redis.mget(keys), strict=True) if v is not None}

    def add(self, key, value, expire=0, noreply=False):
        # memcached's expire 0 is "no expiry"; Redis's EX must be positive.
        return bool(self.redis.set(key, value, nx=True, ex=expire or None))

    def incr(self, key, delta, noreply=False):
        return self._incr(keys=[key], args=[delta])

    def delete(self, key, noreply=False):
        return bool(self.redis.delete(key))

    def delete_if(self, key, value):
        """Delete `key` only while it holds `value`: one atomic script."""
        return bool(self._delete_if(keys=[key], args=[value]))

    def flush_all(self, noreply=False):
        return self.redis.flushdb()

    def close(self):
        self.redis.close()


def make_global_cache(client):
    """ndb's global cache on the same server: MemcacheCache or RedisCache, with the same strictness.

    strict_read=False: a read that cannot reach the cache is a miss, and ndb reads Datastore instead.
    strict_write=True, on purpose: before ndb writes an entity of a cached kind it must lock (and afterwards clear) the
    entity's cache entry. If it cannot, the write fails with the cache error and Datastore is not written, so no
    reader can ever find an old copy in the cache once the server answers again (a server that was frozen rather than
    restarted still holds its old entries). Writes of cached kinds fail while the cache is unreachable; reads and
    writes of uncached kinds (counter shards, sequences: `_use_global_cache = False`) go on as normal.
    """
    if client is None:
        return None
    # Its calls counted per request (core/appstats.py), like the app's own.
    if isinstance(client, RedisClient):
        return ndb.RedisCache(CountedClient(client.redis), strict_read=False, strict_write=True)
    return ndb.MemcacheCache(CountedClient(client), strict_read=False, strict_write=True)


def backend_name(client):
    """"memcached", "redis" or "none": what the pages and /healthz call the cache."""
    if client is None:
        return "none"
    return "redis" if isinstance(client, RedisClient) else "memcached"


class Cache:
    """The app's explicit cache operations (counter totals, rendered pages); every failure is a miss or a no-op."""

    def __init__(self, client):
        self.client = client
        self.backend = backend_name(client)
        self._counted = CountedClient(client)  # each call counted for the request (core/appstats.py)

    def _call(self, what, default, *args, **kwargs):
        if self.client is None or BYPASSED.get():
            return default
        try:
            return getattr(self._counted, what)(*args, **kwargs)
        except CACHE_DOWN as e:
            log.warning("%s %s failed: %s", self.backend, what, e)
            return default

    def get(self, key):
        return self._call("get", None, key)

    def get_many(self, keys):
        return self._call("get_many", {}, keys) if keys else {}

    def add(self, key, value, expire):
        """Store only if absent; False when not stored or the cache is away."""
        return bool(self._call("add", False, key, value, expire=expire, noreply=False))

    def claim(self, key, expire):
        """False only when the cache says another caller claimed `key` first; True when this call claimed it or
        the cache is away (a claim that cannot be checked must not stop the caller)."""
        return self._call("add", None, key, 1, expire=expire, noreply=False) is not False

    def incr(self, key, delta=1):
        """Add to a cached number; None when the key is absent (never create it here) or the cache is away."""
        return self._call("incr", None, key, delta, noreply=False)

    def delete(self, key):
        return bool(self._call("delete", False, key, noreply=False))

    def lease(self, key, token, seconds):
        """Take the lease `key` for `seconds` (it expires by itself if never released): True when this call took it,
        False when another holder has it, None when there is no cache to ask (away, frozen, bypassed or none)."""
        return self._call("add", None, key, token, expire=seconds, noreply=False)

    def release(self, key, token):
        """Give back a lease this caller took with `token`; a lease that expired and was taken by another stays."""
        return bool(self._call("delete_if", False, key, token))

    def ping(self):
        """True when the cache answers now."""
        if self.client is None:
            return False
        try:
            self._counted.get("healthz")
            return True
        except CACHE_DOWN:
            return False

    def flush(self):
        """Empty the cache (tests and benchmarks start from a cold one); raises when the server does not answer."""
        if self.client is not None:
            self.client.flush_all(noreply=False)
