"""The cache: memcached (pymemcache, the talk's) or Redis/Valkey (redis-py), one client per process shared by ndb's
global cache and the app's own caching (`Cache`). Memorystore for Memcached takes no new instances after 2027-02-01
and shuts down 2029-01-31; Memorystore for Valkey speaks the Redis protocol, so the app runs on either.

The cache is an accelerator, never a source of truth: an unreachable or frozen server is a miss (bounded by the
timeouts below), so a cache outage slows the site down instead of taking it down.
"""
import contextvars
import json
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, NoReturn, Protocol, TypeVar, cast

import pymemcache
import redis
from google.cloud import ndb
from redis.backoff import NoBackoff
from redis.retry import Retry

from core import costs
from core.production_latency import Model
from core.settings import Settings

log = logging.getLogger(__name__)


class CacheUnreachable(ConnectionError):
    """An OSError from a call to the cache server, told from any other OSError where it reaches a view (core/web.py's
    503). A ConnectionError, which ndb's global caches count as transient (a miss on a read)."""


# What a cache call raises when the server is down, frozen or refuses (memcached's OSErrors as CacheUnreachable).
CACHE_DOWN = (CacheUnreachable, pymemcache.exceptions.MemcacheError, redis.RedisError)

CONNECT_TIMEOUT = 0.25  # seconds; loopback or same-zone Memorystore answers in well under a millisecond
IO_TIMEOUT = 0.25
POOL_SIZE = 32  # one connection per concurrent request thread is plenty
# True while a request runs as if there were no cache (Runtime.cache_bypassed): every call below a miss or a no-op.
BYPASSED = contextvars.ContextVar("cache_bypassed", default=False)
T = TypeVar("T")
CacheValue = bytes | str | int  # what the app stores: numbers, claims' tokens, rendered pages


class CacheClient(Protocol):
    """What the app asks of a cache server, whichever it is: memcached's operations and answers, and ndb's global cache
    on the same server. A failure raises one of CACHE_DOWN; `Cache` turns those into misses."""
    name: str

    def get(self, key: str) -> bytes | None: ...
    def get_many(self, keys: list[str]) -> dict[str, bytes]: ...
    def add(self, key: str, value: CacheValue, expire: int = 0) -> bool: ...
    def set(self, key: str, value: CacheValue, expire: int = 0) -> bool: ...
    def incr(self, key: str, delta: int) -> int | None: ...
    def delete(self, key: str) -> bool: ...
    def delete_if(self, key: str, value: CacheValue) -> bool: ...
    def replace_if(self, key: str, expected: CacheValue, value: CacheValue, expire: int = 0) -> bool: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def global_cache(self, model: Model) -> ndb.GlobalCache | None: ...


def make_client(settings: Settings) -> CacheClient:
    """A thread-safe client for the cache the settings name (memcached hosts or a Redis URL), or NoCache."""
    if settings.redis_url:
        return RedisCacheClient(settings.redis_url, settings.cache_ca)
    if settings.memcached_hosts:
        return MemcachedCacheClient(settings.memcached_hosts)
    return NoCache()


class CountedClient:
    """A cache client with every call counted for the current request (core/costs.py), each first waiting its modelled
    time under a LATENCY profile, its OSErrors raised as CacheUnreachable. redis-py pipelines (ndb's RedisCache
    compare-and-swap) are counted by their round trips."""

    PIPELINE_ROUND_TRIPS = frozenset({"watch", "unwatch", "get", "execute"})  # multi, set... only queue commands

    def __init__(self, client: Any, model: Model, prefix: str = "") -> None:
        self._client = client
        self._prefix = prefix
        self._model = model

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name.startswith("_") or not callable(attribute):
            return attribute
        if name == "pipeline":
            return lambda *args, **kwargs: CountedClient(attribute(*args, **kwargs), self._model,
                                                         prefix="pipeline.")
        if self._prefix and name not in self.PIPELINE_ROUND_TRIPS:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            cost = costs.current()
            started = time.perf_counter()
            waited = self._model.before_cache_call()  # kept with the call (add_cache), not apart from it
            try:
                return attribute(*args, **kwargs)
            except CacheUnreachable:
                raise
            except OSError as e:
                raise CacheUnreachable(f"{type(e).__name__}: {e}") from e
            finally:
                if cost is not None:
                    cost.add_cache(self._prefix + name, started, waited)
        return call


# Both global caches below with the same strictness, on purpose:
# strict_read=False: a read that cannot reach the cache is a miss, and ndb reads Datastore instead.
# strict_write=True: before ndb writes an entity of a cached kind it must lock (and afterwards clear) the entity's
# cache entry. If it cannot, the write fails with the cache error and Datastore is not written, so no reader can ever
# find an old copy in the cache once the server answers again (a server that was frozen rather than restarted still
# holds its old entries). Writes of cached kinds fail while the cache is unreachable; uncached kinds (counter shards,
# sequences: `_use_global_cache = False`) go on as normal.
_STRICTNESS = {"strict_read": False, "strict_write": True}


class MemcachedCacheClient:
    """memcached: one server and a pool of connections, or several by rendezvous hash (a dead one retried after 5 s)."""
    name = "memcached"

    def __init__(self, hosts: tuple[str, ...]) -> None:
        servers = [_parse(h) for h in hosts]
        common = {"connect_timeout": CONNECT_TIMEOUT, "timeout": IO_TIMEOUT, "max_pool_size": POOL_SIZE,
                  "default_noreply": False}  # noreply would hide a failed write: we want to know
        self.memcached = (pymemcache.PooledClient(servers[0], **common) if len(servers) == 1 else
                          pymemcache.HashClient(servers, use_pooling=True, retry_attempts=1, retry_timeout=1,
                                                dead_timeout=5, **common))

    def get(self, key: str) -> bytes | None:
        return self.memcached.get(key)

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        return self.memcached.get_many(keys)

    def add(self, key: str, value: CacheValue, expire: int = 0) -> bool:
        return self.memcached.add(key, value, expire=expire, noreply=False)

    def set(self, key: str, value: CacheValue, expire: int = 0) -> bool:
        return self.memcached.set(key, value, expire=expire, noreply=False)

    def incr(self, key: str, delta: int) -> int | None:
        return self.memcached.incr(key, delta, noreply=False)

    def delete(self, key: str) -> bool:
        return self.memcached.delete(key, noreply=False)

    def delete_if(self, key: str, value: CacheValue) -> bool:
        """memcached's text protocol has no compare-and-delete: a get, then a delete when the value is still ours.
        Between the two another caller can only have stored the key if it had expired first (harmless for a claim:
        docs/lessons/blog.md, "Turns at a hot entity"). Two round trips, counted as one call."""
        return self.memcached.get(key) == _as_bytes(value) and self.memcached.delete(key, noreply=False)

    def replace_if(self, key: str, expected: CacheValue, value: CacheValue, expire: int = 0) -> bool:
        """Store `value` only while `key` holds `expected`: `gets` reads the item's CAS unique, and `cas` stores only
        if no one has stored the key since (https://github.com/memcached/memcached/wiki/Commands#cas). Atomic; a key
        gone meanwhile (evicted, expired, flushed) is not stored. Two round trips, counted as one call."""
        # HashClient answers None, not (value, unique), for a node that failed within its retry_timeout
        found, unique = self.memcached.gets(key) or (None, None)
        return found == _as_bytes(expected) and bool(self.memcached.cas(key, value, unique, expire=expire,
                                                                         noreply=False))

    def flush(self) -> None:
        self.memcached.flush_all(noreply=False)

    def close(self) -> None:
        self.memcached.close()

    def global_cache(self, model: Model) -> ndb.GlobalCache | None:
        return ndb.MemcacheCache(CountedClient(self.memcached, model), **_STRICTNESS)


def _as_bytes(value: CacheValue) -> bytes:
    """A value as memcached gives it back."""
    return value if isinstance(value, bytes) else str(value).encode()


def _parse(host: str) -> tuple[str, int]:
    name, _, port = host.rpartition(":")
    if not name or not port.isdigit():
        raise ValueError(f"memcached host must be host:port, got {host!r}")
    return name, int(port)


# INCRBY creates a missing key at 0; memcached's incr does not, and the callers rely on that (a missing counter total
# is rebuilt from the shards, never started from one increment). One script, so the check and the add are atomic.
_INCR_IF_PRESENT = "if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) end"
_DELETE_IF = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_REPLACE_IF = ("if redis.call('GET', KEYS[1]) == ARGV[1] then "
               "if ARGV[3] == '0' then return redis.call('SET', KEYS[1], ARGV[2]) and 1 end "
               "return redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3]) and 1 end return 0")


class OwnCAConnection(redis.SSLConnection):
    """TLS that trusts the instance's CA alone. redis-py's SSLConnection starts from ssl.create_default_context(),
    which also trusts every CA of the system's store; with the host name unchecked (below), any publicly trusted
    certificate for any name would then pass. Overrides redis-py's `_wrap_socket_with_ssl` (private; redis is
    pinned in requirements.txt)."""

    def _wrap_socket_with_ssl(self, sock: socket.socket) -> ssl.SSLSocket:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no CA loaded: only the one given here
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=self.ca_data)
        return context.wrap_socket(sock)


class RedisCacheClient:
    """Redis/Valkey (redis-py), answering as memcached does."""
    name = "redis"

    def __init__(self, url: str, ca: str | None = None) -> None:
        # rediss:// (Memorystore for Valkey's in-transit encryption): the server's certificate must chain to `ca`, the
        # instance's own CA (Settings.cache_ca), and to nothing else. The host name is not matched: the app reaches
        # the instance by its Private Service Connect endpoint's IP address, and a CA that only this instance uses
        # already says which server it is.
        tls: dict[str, Any] = ({"connection_class": OwnCAConnection, "ssl_ca_data": ca, "ssl_cert_reqs": "required",
                                "ssl_check_hostname": False} if url.startswith("rediss://") else {})
        # One retry, on a broken connection only: a pooled connection to a server that restarted fails once and is
        # replaced. A timeout (frozen server) is not retried: that would double the wait on every call.
        self.redis = redis.Redis.from_url(
            url, socket_timeout=IO_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)), **tls)
        self._incr = self.redis.register_script(_INCR_IF_PRESENT)
        self._delete_if = self.redis.register_script(_DELETE_IF)
        self._replace_if = self.redis.register_script(_REPLACE_IF)

    def get(self, key: str) -> bytes | None:
        return cast(bytes | None, self.redis.get(key))  # bytes: the client is made without decode_responses

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        values = cast(list[bytes | None], self.redis.mget(keys))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def add(self, key: str, value: CacheValue, expire: int = 0) -> bool:
        # memcached's expire 0 is "no expiry"; Redis's EX must be positive.
        return bool(self.redis.set(key, value, nx=True, ex=expire or None))

    def set(self, key: str, value: CacheValue, expire: int = 0) -> bool:
        return bool(self.redis.set(key, value, ex=expire or None))

    def incr(self, key: str, delta: int) -> int | None:
        return self._incr(keys=[key], args=[delta])

    def delete(self, key: str) -> bool:
        return bool(self.redis.delete(key))

    def delete_if(self, key: str, value: CacheValue) -> bool:
        return bool(self._delete_if(keys=[key], args=[value]))

    def replace_if(self, key: str, expected: CacheValue, value: CacheValue, expire: int = 0) -> bool:
        return bool(self._replace_if(keys=[key], args=[expected, value, expire]))

    def flush(self) -> None:
        self.redis.flushdb()

    def close(self) -> None:
        self.redis.close()

    def global_cache(self, model: Model) -> ndb.GlobalCache | None:
        return ndb.RedisCache(CountedClient(self.redis, model), **_STRICTNESS)


class NoCacheServer(Exception):
    """What NoCache answers every call with; `Cache` makes it a miss, silently (nothing is wrong)."""


class NoCache:
    """No cache server (settings with neither MEMCACHED_HOSTS nor REDIS_URL): every call a miss, no global cache."""
    name = "none"

    def _absent(self, *args: object, **kwargs: object) -> NoReturn:
        raise NoCacheServer()

    get = get_many = add = set = incr = delete = delete_if = replace_if = _absent

    def flush(self) -> None:
        pass

    close = flush

    def global_cache(self, model: Model) -> ndb.GlobalCache | None:
        return None


class Cache:
    """The app's explicit cache operations (counter totals, rendered pages); every failure is a miss or a no-op."""

    def __init__(self, client: CacheClient, model: Model) -> None:
        self.client = client
        self.backend = client.name
        self._counted = CountedClient(client, model)  # counted (core/costs.py), waiting under `model`

    def _safely(self, default: T, call: Callable[[CacheClient], T]) -> T:
        """call(the counted client), or `default` when the request bypasses the cache, there is none, or it fails."""
        if BYPASSED.get():
            return default
        try:
            return call(self._counted)
        except NoCacheServer:
            return default
        except CACHE_DOWN as e:
            log.warning("%s call failed: %s", self.backend, e)
            return default

    def get(self, key: str) -> bytes | None:
        return self._safely(None, lambda c: c.get(key))

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        return self._safely({}, lambda c: c.get_many(keys)) if keys else {}

    def read_many(self, keys: list[str]) -> dict[str, bytes] | None:
        """As get_many, but None when the cache did not answer: for a caller that must tell a miss from an outage."""
        return self._safely(None, lambda c: c.get_many(keys))

    def add(self, key: str, value: CacheValue, expire: int) -> bool | None:
        """Store `value` only if `key` is absent, kept `expire` seconds (0: until evicted). True: this call stored it;
        False: another caller added it first (a claim held); None: no cache answered. A caller that must not be
        stopped by a cache it cannot ask tests `is False`."""
        return self._safely(None, lambda c: c.add(key, value, expire))

    def set(self, key: str, value: CacheValue, expire: int) -> bool:
        """Store over whatever is there. Most callers want `add`: a blind store can put back what a writer replaced."""
        return bool(self._safely(False, lambda c: c.set(key, value, expire)))

    def kept_copy(self, key: str, lifetime: int, read: Callable[[], Any]) -> Any:
        """What `read()` returns (a JSON value), from a copy kept `lifetime` seconds (`add`: a copy another reader
        kept meanwhile stays): for reads anyone may repeat that each bill many entities. It may lack those seconds'
        writes."""
        kept = self.get(key)
        if kept is not None:
            return json.loads(kept)
        value = read()
        self.add(key, json.dumps(value), expire=lifetime)
        return value

    def next_number(self, key: str, start: int, expire: int = 0) -> int | None:
        """The next number of a counter every process shares (one `incr`), started at `start` + 1 when the key is
        missing, kept `expire` seconds (0: until evicted); None when the cache is away. Two processes that both find
        it missing both `add` it, one wins, and both then `incr` the same counter: no number is given twice."""
        def numbered(c: CacheClient) -> int | None:
            # `not number`: None for a missing key; False from pymemcache's HashClient for a node that failed within
            # its retry_timeout (it answers instead of raising): the next number is then unknown, as when away
            number = c.incr(key, 1)
            if number is None:
                c.add(key, start, expire)  # False: another process started it first; either way it exists now
                number = c.incr(key, 1)
            return number or None
        return self._safely(None, numbered)

    def incr(self, key: str, delta: int = 1) -> int | None:
        """Add to a cached number; None when the key is absent (never create it here) or the cache is away."""
        return self._safely(None, lambda c: c.incr(key, delta))

    def delete(self, key: str) -> bool:
        return bool(self._safely(False, lambda c: c.delete(key)))

    def replace_if(self, key: str, expected: CacheValue, value: CacheValue, expire: int) -> bool:
        """Store `value` only while `key` still holds `expected` (a claim this caller `add`ed, a random token no one
        else stores): not once another value replaced it, nor if it is gone (evicted, expired, flushed). False too when
        the cache is away."""
        return bool(self._safely(False, lambda c: c.replace_if(key, expected, value, expire)))

    def release(self, key: str, token: CacheValue) -> bool:
        """Delete `key` while it still holds `token` (a claim this caller `add`ed, not another caller's since)."""
        return bool(self._safely(False, lambda c: c.delete_if(key, token)))

    def ping(self) -> str:
        """"ok" when the cache answers now, "down" when it does not, "off" when there is none."""
        try:
            self._counted.get("healthz")
            return "ok"
        except NoCacheServer:
            return "off"
        except CACHE_DOWN:
            return "down"

    def flush(self) -> None:
        """Empty the cache (tests and benchmarks start from a cold one); raises when the server does not answer."""
        self.client.flush()
