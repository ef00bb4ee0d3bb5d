"""memcached: one pooled pymemcache client per process, shared by ndb's global cache and the app's own caching.

memcached is an accelerator, never a source of truth: every helper here treats an unreachable or frozen server as a
miss (bounded by the timeouts below), so a memcached outage slows the site down instead of taking it down.
"""
import logging

import pymemcache
from google.cloud import ndb

log = logging.getLogger(__name__)
# What a memcached call raises when the server is down, frozen or refuses: OSError covers refused connections and
# timeouts, MemcacheError the protocol's own failures.
CACHE_DOWN = (OSError, pymemcache.exceptions.MemcacheError)

CONNECT_TIMEOUT = 0.25  # seconds; loopback or same-zone Memorystore answers in well under a millisecond
IO_TIMEOUT = 0.25
POOL_SIZE = 32  # one connection per concurrent request thread is plenty


def make_client(hosts):
    """A thread-safe client for `hosts` ("host:port" strings), or None when there are none."""
    if not hosts:
        return None
    servers = [_parse(h) for h in hosts]
    common = {"connect_timeout": CONNECT_TIMEOUT, "timeout": IO_TIMEOUT, "max_pool_size": POOL_SIZE,
              "default_noreply": False}  # noreply would hide a failed write: we want to know
    if len(servers) == 1:
        return pymemcache.PooledClient(servers[0], **common)
    # Several servers: keys spread by rendezvous hash; a dead server is retried after 5 s.
    return pymemcache.HashClient(servers, use_pooling=True, retry_attempts=1, retry_timeout=1, dead_timeout=5,
                                 **common)


def _parse(host):
    name, _, port = host.rpartition(":")
    if not name or not port.isdigit():
        raise ValueError(f"memcached host must be host:port, got {host!r}")
    return name, int(port)


def make_global_cache(client):
    """ndb's global cache on the same memcached.

    strict_read=False: a read that cannot reach memcached is a miss, and ndb reads Datastore instead.
    strict_write=True, on purpose: before ndb writes an entity of a cached kind it must lock (and afterwards clear) the
    entity's cache entry. If it cannot, the write fails with the cache error and Datastore is not written, so no
    reader can ever find an old copy in memcached once the server answers again (a server that was frozen rather than
    restarted still holds its old entries). Writes of cached kinds fail while memcached is unreachable; reads and
    writes of uncached kinds (counter shards, sequences: `_use_global_cache = False`) go on as normal.
    """
    if client is None:
        return None
    return ndb.MemcacheCache(client, strict_read=False, strict_write=True)


class Cache:
    """The app's explicit cache operations (counter totals, rendered pages); every failure is a miss or a no-op."""

    def __init__(self, client):
        self.client = client

    def _call(self, what, default, *args, **kwargs):
        if self.client is None:
            return default
        try:
            return getattr(self.client, what)(*args, **kwargs)
        except CACHE_DOWN as e:
            log.warning("memcached %s failed: %s", what, e)
            return default

    def get(self, key):
        return self._call("get", None, key)

    def get_many(self, keys):
        return self._call("get_many", {}, keys) if keys else {}

    def add(self, key, value, expire):
        """Store only if absent; False when not stored or memcached is away."""
        return bool(self._call("add", False, key, value, expire=expire, noreply=False))

    def claim(self, key, expire):
        """False only when memcached says another caller claimed `key` first; True when this call claimed it or
        memcached is away (a claim that cannot be checked must not stop the caller)."""
        return self._call("add", None, key, 1, expire=expire, noreply=False) is not False

    def incr(self, key, delta=1):
        """Add to a cached number; None when the key is absent (never create it here) or memcached is away."""
        return self._call("incr", None, key, delta, noreply=False)

    def delete(self, key):
        return bool(self._call("delete", False, key, noreply=False))

    def ping(self):
        """True when memcached answers now."""
        if self.client is None:
            return False
        try:
            self.client.get("healthz")
            return True
        except CACHE_DOWN:
            return False
