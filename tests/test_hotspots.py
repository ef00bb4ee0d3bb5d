"""The turns at a hot entity (core/hotspots.py) on the real cache of the run (memcached or Redis): a lease is held by
one writer at a time, given back only by its holder, and a cache that is away or frozen costs at most its timeout,
never a stall. What they do across real processes is tests/test_processes.py's subject."""
import threading
import time

from google.cloud import ndb

from bench import posts
from core import costs, hotspots, runtime
from core.cache import IO_TIMEOUT
from devstack.serving import app_env


def _key(name="hot"):
    return ndb.Key("BlogIndex", name)


def test_one_writer_holds_the_turn_and_the_next_gets_it_when_it_is_given_back(app, ndb_context):
    rt = runtime.of(app)
    # Two queues on one cache, as two processes have: the local locks do not reach across them, only the lease does.
    first, second = hotspots.HotEntities(rt.cache), hotspots.HotEntities(rt.cache)
    order, key = [], _key()

    def later():
        with second.turn(key):
            order.append(("second", time.monotonic()))

    with first.turn(key):
        waiter = threading.Thread(target=later)
        waiter.start()
        time.sleep(0.3)
        order.append(("first done", time.monotonic()))
    waiter.join(timeout=10)
    assert [what for what, _ in order] == ["first done", "second"]
    assert order[1][1] - order[0][1] < 0.5  # handed over promptly, not after an expiry


def test_a_lease_is_given_back_only_by_its_holder(app, ndb_context):
    cache = runtime.of(app).cache
    assert cache.add("lease:test", b"mine", 5) is True
    assert cache.add("lease:test", b"theirs", 5) is False
    assert cache.release("lease:test", b"theirs") is False  # not the holder: the lease stays
    assert cache.add("lease:test", b"theirs", 5) is False
    assert cache.release("lease:test", b"mine") is True
    assert cache.add("lease:test", b"theirs", 5) is True


def test_a_claim_stored_as_text_or_a_number_is_given_back_by_its_holder(app, ndb_context):
    """memcached gives every value back as bytes: a claim stored as str or int must still compare equal on release."""
    cache = runtime.of(app).cache
    for mine, theirs in (("mine", "theirs"), (7, 8)):
        assert cache.add("lease:typed", mine, 5) is True
        assert cache.release("lease:typed", theirs) is False
        assert cache.release("lease:typed", mine) is True
        assert cache.add("lease:typed", theirs, 5) is True
        assert cache.release("lease:typed", theirs) is True


def test_a_lease_nobody_gives_back_expires(app, ndb_context):
    rt = runtime.of(app)
    assert rt.cache.add(hotspots._claim_name(_key()), b"a dead holder's", hotspots.CLAIM_SECONDS) is True
    started = time.monotonic()
    with hotspots.HotEntities(rt.cache).turn(_key()):
        waited = time.monotonic() - started
    # memcached's whole-second clock makes a lease of N seconds live N-1 to N.
    assert hotspots.CLAIM_SECONDS - 1.5 <= waited <= hotspots.CLAIM_SECONDS + 1.0


def test_the_lease_a_turn_takes_expires_by_itself(app, ndb_context):
    """A holder that dies in its turn never gives its lease back: the lease goes on its own expiry, CLAIM_SECONDS,
    and no later than that the cache takes another (the waiters' own limit, below, is a second guard, not this one)."""
    rt = runtime.of(app)
    name = hotspots._claim_name(_key())
    turn = hotspots.HotEntities(rt.cache).turn(_key())
    turn.__enter__()  # taken, and never given back: the holder died in its turn
    started = time.monotonic()
    assert rt.cache.add(name, b"another's", 1) is False, "the turn took no lease"
    while rt.cache.add(name, b"the next holder's", 1) is False and time.monotonic() - started < 10:
        time.sleep(0.05)
    # memcached's whole-second clock makes a lease of N seconds live N-1 to N.
    assert time.monotonic() - started <= hotspots.CLAIM_SECONDS + 1.0


def test_a_waiter_goes_on_without_the_lease_once_a_living_holder_would_have_given_it_back(app, ndb_context):
    """A lease kept longer than any living holder keeps it (one stored with a longer expiry: by an older version of
    the app, or by hand) stalls a waiter CLAIM_SECONDS at most: it goes on without, the transaction guarding all."""
    rt = runtime.of(app)
    assert rt.cache.add(hotspots._claim_name(_key()), b"a stuck holder's", 8) is True
    started = time.monotonic()
    with hotspots.HotEntities(rt.cache).turn(_key()):
        waited = time.monotonic() - started
    assert hotspots.CLAIM_SECONDS - 0.5 <= waited <= hotspots.CLAIM_SECONDS + 1.0


def test_a_frozen_cache_costs_its_timeout_and_the_writer_goes_on_without_a_lease(app, stack, ndb_context):
    rt = runtime.of(app)
    stack.cache.pause()
    try:
        started = time.monotonic()
        with rt.hot_entities.turn(_key()):
            waited = time.monotonic() - started
    finally:
        stack.cache.resume()
    assert waited < IO_TIMEOUT * 4


def test_without_leases_the_turns_stay_within_the_process(app, ndb_context):
    rt = runtime.of(app)
    assert rt.cache.add(hotspots._claim_name(_key()), b"another process's", 30) is True
    started = time.monotonic()
    with hotspots.HotEntities(rt.cache, claims=False).turn(_key()):
        assert time.monotonic() - started < 0.5


def test_the_benchmarks_app_before_the_lease_queues_only_within_its_process(stack, monkeypatch):
    """bench/posts.py's `local lock` variant: the app gunicorn serves there builds its own HotEntities without leases
    (no setting of the production app turns the lease off)."""
    for name, value in app_env(stack, "bench-secret", admins="").items():
        monkeypatch.setenv(name, value)
    app = posts.local_lock()
    try:
        assert runtime.of(app).hot_entities.claims is False
    finally:
        runtime.of(app).close()


def test_with_the_cache_away_a_writer_asks_once_and_gives_back_nothing(app, stack, ndb_context):
    """`add` answers None when no cache answers: the writer goes on at once, holding no lease, and sends no release."""
    rt = runtime.of(app)
    stack.cache.stop()
    try:
        with costs.measured() as cost, rt.hot_entities.turn(_key()):
            pass
    finally:
        stack.cache.start()
    assert dict(cost.cache) == {"add": 1}
