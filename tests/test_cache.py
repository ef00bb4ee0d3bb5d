"""The cache interface (core/cache.py) held to one contract on both real caches, memcached and redis-server, whatever
CACHE the session runs with: the talk's explicit calls, ndb's global cache on each, and the faults (server stopped,
frozen with SIGSTOP, restarted empty). The whole app's fault tests run on the session's cache (make test CACHE=...).
"""
import time

import pytest
from google.cloud import ndb

from core import cache as cache_module
from core import runtime
from core.production_latency import OFF
from core.settings import Settings
from devstack.services import CACHES
from tests.support import make_app, running

LOCAL = {"DATASTORE_EMULATOR_HOST": "127.0.0.1:8081"}  # local development: no SECRET_KEY needed


@pytest.fixture(scope="module", params=sorted(CACHES))
def server(request):
    """A cache server of each kind, of its own (not the session's), for this module."""
    s = CACHES[request.param]().start()
    yield s
    s.stop()


@pytest.fixture
def cache(server):
    if not server.healthy():
        server.restart()
    client = cache_module.make_client(Settings.from_env(dict(server.env(), DATASTORE_DATASET="p", **LOCAL)))
    c = cache_module.Cache(client, OFF)
    c.flush()
    yield c
    client.close()


def test_settings_choose_the_cache():
    # No cache server: one object whose every answer is a miss (an add is neither stored nor refused: None), and no
    # global cache for ndb.
    none = cache_module.Cache(cache_module.make_client(Settings.from_env(LOCAL)), OFF)
    assert none.backend == "none" and none.client.global_cache(OFF) is None
    assert (none.get("k"), none.get_many(["k"]), none.add("k", 1, 60), none.incr("k"), none.delete("k")) == \
        (None, {}, None, None, False)
    assert none.release("k", "t") is False
    assert none.ping() == "off"
    assert Settings.from_env({**LOCAL, "REDIS_URL": "redis://10.0.0.3:6379/0"}).redis_url == "redis://10.0.0.3:6379/0"
    with pytest.raises(RuntimeError, match="not both"):
        Settings.from_env({**LOCAL, "REDIS_URL": "redis://10.0.0.3:6379", "MEMCACHED_HOSTS": "10.0.0.4:11211"})
    with pytest.raises(RuntimeError, match="REDIS_URL must be a redis://"):
        Settings.from_env({**LOCAL, "REDIS_URL": "10.0.0.3:6379"})


def test_the_talks_calls_answer_alike(cache, server):
    assert cache.backend == server.backend
    assert cache.add("n", 5, expire=60) is True
    assert cache.add("n", 6, expire=60) is False  # add never overwrites
    assert cache.get("n") == b"5" and cache.get("absent") is None
    assert cache.incr("n", 2) == 7
    assert cache.incr("absent") is None and cache.get("absent") is None  # incr never creates a key
    assert cache.get_many(["n", "absent"]) == {"n": b"7"} and cache.get_many([]) == {}
    assert cache.add("blob", b"\x00\xffbytes", expire=60) and cache.get("blob") == b"\x00\xffbytes"
    assert cache.delete("n") is True and cache.delete("n") is False and cache.get("n") is None
    assert cache.ping() == "ok"


def test_values_expire(cache):
    assert cache.add("short", 1, expire=1)
    assert cache.add("forever", 1, expire=0)  # memcached's 0 is "never"; Redis needs no EX for that
    deadline = time.monotonic() + 5
    while cache.get("short") is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cache.get("short") is None and cache.get("forever") == b"1"


def test_a_stopped_cache_is_a_miss_and_a_restarted_one_is_used_again(cache, server):
    cache.add("k", 1, expire=60)
    server.stop()
    started = time.monotonic()
    assert cache.get("k") is None and cache.get_many(["k"]) == {} and cache.incr("k") is None
    # an add that no cache answered is None: neither stored nor refused (a lease or a lock cannot be refused by it)
    assert cache.add("k", 2, expire=60) is None and cache.delete("k") is False and cache.ping() == "down"
    assert time.monotonic() - started < 2
    server.start()  # same port, empty, as after a crash: the pooled connections are replaced
    assert cache.get("k") is None and cache.add("k", 3, expire=60) is True and cache.get("k") == b"3"


def test_a_frozen_cache_costs_its_timeout_and_no_more(cache, server):
    cache.add("k", 1, expire=60)
    server.pause()
    try:
        started = time.monotonic()
        assert cache.get("k") is None and cache.incr("k") is None and cache.add("j", 1, expire=60) is None
        elapsed = time.monotonic() - started
    finally:
        server.resume()
    # three calls, each bounded by the I/O timeout (a connect may add its own): never the client's default of seconds
    assert elapsed < 3 * (cache_module.IO_TIMEOUT + cache_module.CONNECT_TIMEOUT) + 0.5
    # Resumed, not restarted: it still holds its entries. And a call that timed out has an unknown outcome, not a
    # failed one: the incr sent into the frozen server may be applied when it wakes (both caches do so here).
    assert cache.get("k") in (b"1", b"2")


class Note(ndb.Model):
    text = ndb.StringProperty()


@pytest.fixture
def cached_app(server, stack):
    """The app on the session's emulator with this module's cache server."""
    with running(make_app(stack, checked=False, **stack.fresh(), **server.env())) as app:
        runtime.of(app).cache.flush()
        yield app


def test_ndb_global_cache_runs_on_either_cache(cached_app, server):
    rt = runtime.of(cached_app)
    assert type(rt.datastore.global_cache).__name__ == {"memcached": "MemcacheCache",
                                                          "redis-server": "RedisCache"}[server.name]
    with rt.context():
        key = Note(id="n", text="first").put()
    with rt.context():
        assert key.get().text == "first"  # read from Datastore, then kept in the global cache
    assert _keys(server), "ndb left nothing in the global cache"
    with rt.context():
        Note(key=key, text="second").put()  # a write clears the entity's cache entry
    with rt.context():
        assert key.get().text == "second"


def test_ndb_writes_of_cached_kinds_fail_whole_while_the_cache_is_away(cached_app, server):
    rt = runtime.of(cached_app)
    with rt.context():
        key = Note(id="n", text="first").put()
    server.stop()
    try:
        with rt.context(), pytest.raises(cache_module.CACHE_DOWN):
            Note(key=key, text="lost").put()
        with rt.context():
            assert key.get().text == "first"  # reads go on (strict_read=False) and the failed write wrote nothing
    finally:
        server.start()


def _keys(server):
    """What the server holds now, read with its own protocol (not through the client under test)."""
    if server.name == "redis-server":
        import redis
        return redis.Redis.from_url(server.url).keys("*")
    import socket
    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as conn:
        conn.sendall(b"lru_crawler metadump all\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    return [line.split(b" ")[0] for line in data.splitlines() if line.startswith(b"key=")]


def test_replace_if_stores_only_over_the_value_the_caller_expects(cache):
    """A lease's holder stores its read only while its lease is there (core/identity.generation): not over another
    value, not once the key is gone (evicted, expired, flushed), on both caches."""
    assert cache.add("g", "lease:1", expire=60) is True
    assert cache.replace_if("g", "lease:1", "v1", expire=60) is True and cache.get("g") == b"v1"
    assert cache.replace_if("g", "lease:1", "v2", expire=60) is False and cache.get("g") == b"v1"
    cache.delete("g")
    assert cache.replace_if("g", "v1", "v3", expire=60) is False and cache.get("g") is None
