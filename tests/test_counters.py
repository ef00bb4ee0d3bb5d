"""Counters at the service level, on the real emulator and memcached: exactness under concurrency, caching, growth."""
import datetime
import time
import types

import pytest
from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import clock, costs, idempotency, runtime
from core.errors import BadInput, Conflict, Unprocessable
from counters import growth, service, simple, totals, writes
from counters.models import AppliedIncrement, CounterConfig, CounterShard
from counters.simple import SimpleCounterShard
from tests.support import in_threads, plain_name, writers_meet_before_writing

THREADS, EACH = 32, 50


def _hammer(fn, threads=THREADS, each=EACH):
    """`threads` writers at once, `each` increments apiece; the Increment results, flattened."""
    return [r for batch in in_threads(threads, lambda i: [fn() for _ in range(each)]) for r in batch]


@pytest.mark.parametrize("mode", ["general", "adaptive"])
def test_concurrent_increments_are_exact(ndb_context, backend, mode):
    growth.configure("hot", mode)
    results = _hammer(lambda: service.increment("hot"))
    assert len(results) == THREADS * EACH and all(r.applied for r in results)
    config = growth.require_config("hot")
    assert sum(totals.shard_counts_of(config)) == THREADS * EACH
    if backend == "legacy":  # optimistic: the writers did collide (so the retry path ran), each retry landed once
        assert sum(r.attempts for r in results) > THREADS * EACH
    else:  # Firestore: blind server-side increments read nothing and lock nothing, so nothing collides
        assert all(r.attempts == 1 for r in results)
    runtime.cache().delete("counter-total:hot")
    assert totals.get_total("hot") == totals.Total(THREADS * EACH, False)


def test_uncontended_increments_reach_every_shard(ndb_context):
    """Every shard can be an increment's first pick: 80 increments one after another (nothing collides, so no retry
    moves them) land on each of 3 shards. A uniform pick leaves some shard empty with probability at most
    3 * (2/3)**80, about 2.4e-14; a pick that never chooses some shard leaves it empty every time."""
    growth.configure("spread", "general", 3)
    results = [service.increment("spread") for _ in range(80)]
    assert all(r.applied and r.attempts == 1 for r in results)
    assert sorted({r.shard for r in results}) == [0, 1, 2]
    counts = totals.shard_counts_of(growth.require_config("spread"))
    assert len(counts) == 3 and all(counts) and sum(counts) == 80, counts


def test_simple_counter_is_exact_under_concurrency(ndb_context, backend):
    attempts = _hammer(simple.increment)
    counts = simple.shard_counts()
    assert len(counts) == simple.SHARDS and sum(counts) == THREADS * EACH
    assert sum(1 for c in counts if c) > 10  # the load was spread, not piled on one shard
    if backend == "legacy":  # optimistic: 32 writers on 20 shards met, and each retry landed once
        assert sum(attempts) > THREADS * EACH


def test_simple_counters_total_is_kept_in_the_cache_and_follows_each_increment(ndb_context):
    assert simple.total() == 0  # summed from the shards, and kept
    for _ in range(3):
        simple.increment()
    with costs.measured() as cost:
        assert simple.total() == 3  # the kept copy, incremented after each commit
    assert cost.datastore == {}
    runtime.cache().flush()  # a cache that lost it: summed again
    with costs.measured() as cost:
        assert simple.total() == 3
    assert cost.datastore == {"Lookup": 1}


def test_simple_counter_shards_are_created_lazily(ndb_context):
    assert ndb.get_multi([ndb.Key(SimpleCounterShard, f"shard-{i}") for i in range(20)]) == [None] * 20
    simple.increment()
    assert sum(1 for s in ndb.get_multi([ndb.Key(SimpleCounterShard, f"shard-{i}") for i in range(20)]) if s) == 1
    assert sum(simple.shard_counts()) == 1


def test_first_increment_creates_a_general_counter(ndb_context):
    assert growth.get_config("fresh") is None
    service.increment("fresh")
    config = growth.get_config("fresh")
    assert (config.mode, config.num_shards) == ("general", growth.DEFAULT_SHARDS["general"])


def test_racing_first_increments_create_one_counter(ndb_context):
    in_threads(16, lambda i: service.increment("born-busy"))
    assert CounterConfig.query().fetch(keys_only=True) == [ndb.Key(CounterConfig, "born-busy")]
    assert sum(totals.shard_counts_of(growth.require_config("born-busy"))) == 16


def test_cached_total_follows_increments(ndb_context):
    growth.configure("c", "general")
    assert totals.get_total("c") == totals.Total(0, False)  # summed, then cached
    assert totals.get_total("c") == totals.Total(0, True)
    for n in range(1, 6):
        service.increment("c")
        assert totals.get_total("c") == totals.Total(n, True)  # incr'd after each commit


def _first_commit_fails(monkeypatch, backend, error):
    """The next increment's first commit fails with `error` and applies nothing: on legacy its transaction's body has
    run (the shard read and +1 written, what follows the commit queued) before the commit raises; on Firestore the
    blind commit raises. The list the failure is appended to."""
    failed = []
    if backend == "legacy":
        real = ndb.transaction

        def transaction(fn, **options):
            if plain_name(fn) != "once.<locals>.txn" or failed:  # core.exactly_once.once, its transaction
                return real(fn, **options)

            def body_then_refused():
                fn()
                failed.append(error)
                raise error
            return real(body_then_refused, **options)
        monkeypatch.setattr(ndb, "transaction", transaction)
    else:
        increments = runtime.current().datastore.increments
        real = increments.commit

        def commit(*args, **kwargs):
            if failed:
                return real(*args, **kwargs)
            failed.append(error)
            raise error
        monkeypatch.setattr(increments, "commit", commit)
    return failed


@pytest.mark.parametrize("error", [core_exceptions.Aborted("collided"),
                                   core_exceptions.ServiceUnavailable("Datastore is not answering"),
                                   core_exceptions.PermissionDenied("refused")])
def test_the_cached_total_moves_once_per_applied_commit_never_for_a_failed_one(ndb_context, backend, monkeypatch,
                                                                              error):
    """The cached total is `incr`ed after the commit, never before it nor inside the transaction: an increment whose
    first commit collided, or did not answer (and was tried again), moves it exactly once; one whose commit was
    refused (and raised) not at all. No threads: the failure is made at the commit."""
    growth.configure("once", "general", 4)
    service.increment("once")
    assert totals.get_total("once") == totals.Total(1, False)  # summed, then kept in the cache
    failed = _first_commit_fails(monkeypatch, backend, error)
    if not isinstance(error, core_exceptions.PermissionDenied):
        assert service.increment("once").attempts == 2
        expected = 2
    else:
        with pytest.raises(core_exceptions.PermissionDenied):
            service.increment("once")
        expected = 1
    monkeypatch.undo()
    assert failed == [error]
    assert sum(totals.shard_counts_of(growth.require_config("once"))) == expected
    assert totals.get_total("once") == totals.Total(expected, True)


def test_cached_total_is_rebuilt_after_expiry(ndb_context, monkeypatch):
    monkeypatch.setattr(simple, "TOTAL_LIFETIME", 1)
    for _ in range(3):
        service.increment("short")
    assert totals.get_total("short") == totals.Total(3, False)
    assert totals.get_total("short").cached
    time.sleep(2.2)  # memcached drops it
    assert runtime.cache().get("counter-total:short") is None
    service.increment("short")  # incr on a missing key does not re-create it with a wrong value
    assert runtime.cache().get("counter-total:short") is None
    assert totals.get_total("short") == totals.Total(4, False)
    assert totals.get_total("short") == totals.Total(4, True)


def test_increase_shards_never_lowers(ndb_context):
    growth.configure("g", "general")
    assert growth.increase_shards("g", 5).num_shards == 20
    assert growth.increase_shards("g", 20).num_shards == 20
    assert growth.increase_shards("g", 40).num_shards == 40
    assert growth.increase_shards("g", 1).num_shards == 40
    assert growth.configure("g", "general", 3).num_shards == 40
    assert growth.get_config("g").num_shards == 40


def test_counts_survive_growing_the_shards(ndb_context):
    growth.configure("grow", "general", 2)
    for _ in range(10):
        service.increment("grow")
    growth.increase_shards("grow", 50)
    for _ in range(10):
        service.increment("grow")
    runtime.cache().delete("counter-total:grow")
    assert totals.get_total("grow").count == 20


def test_adaptive_counter_grows_under_contention(ndb_context, backend):
    growth.configure("busy", "adaptive")
    assert growth.get_config("busy").num_shards == 1
    results = _hammer(lambda: service.increment("busy"), threads=24, each=30)
    grown = growth.get_config("busy").num_shards
    if backend == "legacy":
        assert 1 < grown <= growth.ADAPTIVE_MAX_SHARDS
    else:
        # The Firestore emulator never refuses a blind increment, so there is no contention to grow on (production
        # answers a document written past its sustained rate with ABORTED, which the same loop counts as a collision).
        assert grown == 1 and all(r.attempts == 1 for r in results)
    assert sum(totals.shard_counts_of(growth.get_config("busy"))) == len(results) == 24 * 30


def test_adaptive_counter_stays_at_one_shard_when_writes_are_sequential(ndb_context):
    growth.configure("calm", "adaptive")
    results = [service.increment("calm") for _ in range(60)]
    assert all(r.attempts == 1 for r in results)
    assert growth.get_config("calm").num_shards == 1
    assert CounterShard.key_for("calm", 0).get().count == 60


def test_adaptive_growth_stops_at_the_cap(ndb_context):
    """A verdict that would pass the cap stops at it, from below too (128 asked to grow 4x: 256, not 512); at the cap,
    `grow` changes nothing."""
    below = growth.ADAPTIVE_MAX_SHARDS // 2
    growth.configure("near-cap", "adaptive", below)
    assert growth.grow("near-cap", below, 4) == growth.ADAPTIVE_MAX_SHARDS
    assert growth.get_config("near-cap").num_shards == growth.ADAPTIVE_MAX_SHARDS
    growth.configure("capped", "adaptive", growth.ADAPTIVE_MAX_SHARDS)
    assert growth.grow("capped", growth.ADAPTIVE_MAX_SHARDS, 4) == growth.ADAPTIVE_MAX_SHARDS
    assert growth.get_config("capped").num_shards == growth.ADAPTIVE_MAX_SHARDS


def test_mode_is_fixed_at_creation(ndb_context):
    growth.configure("m", "adaptive")
    with pytest.raises(Conflict):
        growth.configure("m", "general")
    assert growth.get_config("m").mode == "adaptive"


def test_idempotency_key_applies_once_however_often_retried(ndb_context):
    results = [service.increment("idem", "order-42", caller="u1") for _ in range(5)]
    assert [r.replayed for r in results] == [False, True, True, True, True] and all(r.applied for r in results)
    assert len({(r.attempts, r.shard) for r in results}) == 1  # the first answer, each time
    assert sum(totals.shard_counts_of(growth.get_config("idem"))) == 1
    assert not service.increment("idem", "order-43", caller="u1").replayed  # another key is another increment
    assert sum(totals.shard_counts_of(growth.get_config("idem"))) == 2


def test_a_marker_without_a_stamp_is_another_calls_never_nothing_written(ndb_context):
    """A marker without its call's stamp (a writer that left it out) still says the key was applied: the increment
    answers as a replay and counts nothing, on either backend's writer; it is never taken for this call's own."""
    service.increment("unstamped", "first", caller="u1")
    before = sum(totals.shard_counts_of(growth.get_config("unstamped")))
    request = idempotency.keyed("old-key", "u1", service.ENDPOINT, "unstamped", None)
    AppliedIncrement(key=AppliedIncrement.key_for(request), fingerprint=request.fingerprint,
                     expires=clock.now() + datetime.timedelta(days=1)).put()  # no `call`
    assert service.increment("unstamped", "old-key", caller="u1").replayed
    assert sum(totals.shard_counts_of(growth.get_config("unstamped"))) == before


def test_concurrent_retries_of_one_key_apply_once(ndb_context):
    growth.configure("idem2", "general")
    results = in_threads(8, lambda i: service.increment("idem2", "same-key", caller="u1"))
    assert sum(not r.replayed for r in results) == 1
    assert sum(totals.shard_counts_of(growth.get_config("idem2"))) == 1


def test_two_sends_of_one_key_that_both_find_no_marker_before_either_writes_apply_once(legacy_app, monkeypatch):
    """Legacy's increment reads the key's marker and writes it with the shard in one transaction. Two sends of one key
    that both read "no marker" before either writes (forced: they meet at the commit's `ndb.put_multi` of the shard
    and the marker, which both must reach) still count once: one commits, the other collides, retries, finds the
    marker and answers not applied. (Firestore's blind increment reads nothing: its marker is an insert in the same
    commit, which a second send cannot repeat; test_backends.)"""
    with runtime.current().context():
        growth.configure("idem3", "general", 1)
    met = writers_meet_before_writing(monkeypatch)
    results = in_threads(2, lambda i: service.increment("idem3", "sent-twice", caller="u1"))
    assert len(met) == 2, "the two sends did not meet before writing: nothing was forced"
    assert sorted(r.replayed for r in results) == [False, True]
    with runtime.current().context():
        assert totals.shard_counts_of(growth.get_config("idem3")) == [1]


def test_an_idempotency_key_is_its_callers_across_counters(ndb_context):
    """A caller's key on one counter, sent for another: a 409, nothing counted. Another caller's same key: theirs."""
    assert not service.increment("a", "k", caller="u1").replayed
    with pytest.raises(Conflict):
        service.increment("b", "k", caller="u1")
    assert not service.increment("b", "k", caller="u2").replayed
    assert [sum(totals.shard_counts_of(growth.get_config(name))) for name in ("a", "b")] == [1, 1]


@pytest.mark.parametrize("name", ["", "x" * 101, "has space", "slash/name", "pipe|name", "ünïcode", None, 7])
def test_bad_names_are_refused_and_write_nothing(ndb_context, name):
    with pytest.raises(BadInput):
        service.increment(name)
    with pytest.raises(BadInput):
        growth.configure(name, "general")
    assert CounterConfig.query().fetch(keys_only=True) == []
    assert CounterShard.query().fetch(keys_only=True) == []


@pytest.mark.parametrize("shards", [0, -1, 1001, 2.5, "10", True, None])
def test_bad_shard_counts_are_refused(ndb_context, shards):
    growth.configure("s", "general")
    with pytest.raises(Unprocessable):
        growth.increase_shards("s", shards)
    assert growth.get_config("s").num_shards == 20


def test_totals_are_strongly_consistent_at_default_consistency(weak_app):
    """Gets by key are strongly consistent: at consistency 0.9 every read still sees every increment."""
    with runtime.current().context():
        growth.configure("weak", "adaptive")
        for n in range(1, 41):
            service.increment("weak")
            runtime.cache().delete("counter-total:weak")
            assert totals.get_total("weak").count == n
            assert sum(simple.shard_counts()) == n - 1
            simple.increment()


def test_contention_window_grows_only_on_lasting_contention():
    window, n = growth.ContentionWindow(), growth.ContentionWindow.WINDOW
    assert [window.observe("w", 4, i == 0) for i in range(n)] == [0] * n  # one collision in 32: noise
    assert [window.observe("w", 4, i % 8 == 0) for i in range(n)] == [0] * (n - 1) + [2]  # an eighth: double
    # The verdict asked for 8 shards: attempts still reported at 4 are from before the growth and are ignored.
    assert [window.observe("w", 4, True) for _ in range(2 * n)] == [0] * 2 * n
    assert [window.observe("w", 8, i % 3 == 0) for i in range(n)] == [0] * (n - 1) + [4]  # a third: 3.4x GROW_AT
    assert window.observe("w", 256, False) == 0  # grown further elsewhere: the window starts afresh at 256
    assert [window.observe("w", 256, i % 2 == 0) for i in range(n - 1)][-1] == 8  # half: 5x GROW_AT
    # One shard is judged after 8 attempts; all of them collided, 10x GROW_AT: 16 shards at once.
    assert [window.observe("new", 1, True) for _ in range(8)] == [0] * 7 + [16]
    assert window.observe("other", 1, True) == 0  # windows are per counter


def test_an_adaptive_counter_whose_growth_did_not_apply_is_judged_again(legacy_app, monkeypatch):
    """A verdict's growth can fail to apply (its transaction collides, or the cache is away); the process's window then
    starts again at the size the counter still has, and a later verdict grows it. Legacy: the Firestore emulator's
    blind increments never collide, so nothing grows there."""
    with runtime.current().context():
        growth.configure("regrow", "adaptive")
    real, failed = growth.grow, []

    def first_growth_fails(name, seen_shards, factor):
        if not failed:
            failed.append(factor)
            return seen_shards
        return real(name, seen_shards, factor)

    monkeypatch.setattr(growth, "grow", first_growth_fails)
    _hammer(lambda: service.increment("regrow"), threads=24, each=30)
    with runtime.current().context():
        assert failed and growth.get_config("regrow").num_shards > 1


def test_a_growth_whose_transaction_collides_is_skipped_not_raised(ndb_context, monkeypatch):
    """Growing is best effort, one attempt: a collision leaves the counter as it was for a later window to grow."""
    growth.configure("collides", "adaptive")

    def collided(*args, **kwargs):
        raise core_exceptions.Aborted("another writer of the config")
    monkeypatch.setattr(ndb, "transaction", collided)
    assert growth.grow("collides", 1, 4) == 1
    monkeypatch.undo()
    assert growth.get_config("collides").num_shards == 1


def test_adaptive_grow_is_one_step_per_verdict(ndb_context):
    growth.configure("steps", "adaptive")
    assert growth.grow("steps", 1, 4) == 4
    assert growth.grow("steps", 1, 4) == 4  # a second verdict from the old size changes nothing
    assert growth.grow("steps", 4, 2) == 8
    assert growth.get_config("steps").num_shards == 8


@pytest.mark.parametrize("error", [core_exceptions.Unknown("the commit's outcome is unknown"),
                                   core_exceptions.DeadlineExceeded("the commit was not answered in time"),
                                   core_exceptions.ServiceUnavailable("the connection dropped before the answer")])
def test_an_increment_whose_commit_answered_unknown_but_applied_still_moves_the_cached_total(ndb_context, monkeypatch,
                                                                                            error):
    """A commit can answer UNKNOWN, DEADLINE_EXCEEDED or UNAVAILABLE and yet have applied; what follows a commit (the
    cached total's incr) then never ran. The retry, the same call, finds its own marker: applied once, answered as
    applied (not a 503, not a replay), and the cached total still follows it."""
    growth.configure("unknown", "general", 1)
    service.increment("unknown")
    assert totals.get_total("unknown") == totals.Total(1, False)  # summed, then kept in the cache
    real, lost = writes.ShardWriter._counted, []

    def answer_lost(writer, answer):
        if not lost:  # the first commit applied; its answer is lost, so nothing after it runs
            lost.append(writer)
            raise error
        return real(writer, answer)

    monkeypatch.setattr(writes.ShardWriter, "_counted", answer_lost)
    result = service.increment("unknown", "k1", caller="u1")
    # answered as the commit that counted stored it (its one attempt), so that a resend of k1 answers the same
    assert lost and result.applied is True and not result.replayed and result.attempts == 1
    assert totals.shard_counts_of(growth.get_config("unknown")) == [2]
    assert totals.get_total("unknown") == totals.Total(2, True)  # the cached total, moved on by the retry
    again = service.increment("unknown", "k1", caller="u1")
    assert again.replayed and (again.attempts, again.shard) == (result.attempts, result.shard)


def test_an_increment_retried_on_another_shard_after_its_unknown_commit_names_the_shard_that_counted(
        ndb_context, monkeypatch):
    """The answer's `shard` is where the +1 landed: a keyed increment whose commit answered UNKNOWN yet applied is
    retried on another shard (the collision policy), and that retry, finding its own marker, names the first
    attempt's shard, not its own."""
    growth.configure("moved", "general", 8)
    real, lost = writes.ShardWriter._counted, []

    def answer_lost(writer, answer):
        if not lost:
            lost.append(answer["shard"])
            raise core_exceptions.Unknown("the commit's outcome is unknown")
        return real(writer, answer)

    monkeypatch.setattr(writes.ShardWriter, "_counted", answer_lost)
    result = service.increment("moved", "k1", caller="u1")
    counts = totals.shard_counts_of(growth.get_config("moved"))
    assert result.attempts == 1 and sum(counts) == 1  # the answer the counting commit stored: its attempt, its shard
    assert counts[result.shard] == 1 and result.shard == lost[0]


def _colliding_once(monkeypatch):
    """Each increment's first attempt collides (ABORTED, before it writes); the shards the attempts chose."""
    real, tried = writes.shard_writer, []

    def writer(name, marker_key):
        write = real(name, marker_key).write

        def attempt(index, attempts):
            tried.append(index)
            if len(tried) == 1:
                raise core_exceptions.Aborted("collided")
            return write(index, attempts)
        return types.SimpleNamespace(write=attempt)
    monkeypatch.setattr(service, "shard_writer", writer)
    return tried


@pytest.mark.parametrize("mode", ["general", "adaptive"])
def test_a_collision_moves_the_increment_to_another_shard_at_once(ndb_context, monkeypatch, mode):
    """The shard re-pick is the retry loop's collision policy: the collided +1 goes at once (no backoff) to another
    shard, and an adaptive counter's window hears the collision, then the success."""
    growth.configure("moves", mode, 4)
    tried, slept, heard = _colliding_once(monkeypatch), [], []
    monkeypatch.setattr(writes, "backoff", lambda *args: slept.append(args))
    monkeypatch.setattr(growth.contention, "observe", lambda name, shards, collided: heard.append(collided) or 0)
    result = service.increment("moves")
    assert result.applied and result.attempts == 2 and tried[0] != tried[1] == result.shard and not slept
    assert heard == ([True, False] if mode == "adaptive" else [])
    assert sum(totals.shard_counts_of(growth.require_config("moves"))) == 1


def test_a_collision_on_a_single_shard_waits_a_jittered_while(ndb_context, monkeypatch):
    """One shard: nowhere else to go, so the retry waits its backoff (up to 0.5 s first) on the same shard."""
    growth.configure("alone", "general", 1)
    tried, slept = _colliding_once(monkeypatch), []
    monkeypatch.setattr(writes, "backoff", lambda *args: slept.append(args))
    assert service.increment("alone").attempts == 2
    assert tried == [0, 0] and slept == [(1, writes.SINGLE_SHARD_BACKOFF, writes.SINGLE_SHARD_BACKOFF_CAP)]


def test_a_count_riding_on_a_request_never_fails_it(ndb_context, monkeypatch):
    """A feature's own counter is best effort: Datastore not answering while it counts is logged, not raised, so a
    comment already written is not answered with an error."""
    def down(*args, **kwargs):
        raise core_exceptions.ServiceUnavailable("Datastore is not answering")

    monkeypatch.setattr(service, "commit_on_a_shard", down)
    assert service.owned("feature").increment("views") is False


def test_a_count_riding_on_a_request_raises_a_programming_error(ndb_context, monkeypatch):
    """Best effort covers what cannot be done now (Datastore, the cache, contention), not bugs: a TypeError from the
    increment reaches the caller (and its tests) instead of being logged away."""
    def broken(*args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(service, "commit_on_a_shard", broken)
    with pytest.raises(TypeError):
        service.owned("feature").increment("views")


def test_seed_command_seeds_once(app):
    runner = app.test_cli_runner()
    first, second = runner.invoke(args=["seed"]).output, runner.invoke(args=["seed"]).output
    for feature in ("counters", "blog", "comments"):
        assert f"{feature}: seeded" in first and f"{feature}: already has content" in second
    with runtime.current().context():
        names = sorted(c.name for c in CounterConfig.query(CounterConfig.listed == True).fetch())  # noqa: E712
        assert names == ["downloads", "likes", "page-views"]
        likes = growth.get_config("likes")
        # (whether the burst grew it depends on how its writers collided; growth itself is tested on its own above)
        assert likes.mode == "adaptive" and sum(totals.shard_counts_of(likes)) == 320
        assert sum(simple.shard_counts()) == 30


def test_list_counters_batches_and_caches_totals(ndb_context):
    plan = {"a-one": (1, 3), "b-five": (5, 7), "c-twenty": (20, 11), "d-grown": (2, 4)}
    for name, (shards, times) in plan.items():
        growth.configure(name, "general", shards)
        for _ in range(times):
            service.increment(name)
    growth.increase_shards("d-grown", 9)
    service.increment("d-grown")
    runtime.current().cache.flush()
    expected = [("a-one", 3), ("b-five", 7), ("c-twenty", 11), ("d-grown", 5)]
    first = totals.list_counters()
    assert [(c.name, t.count, t.cached) for c, t, _ in first] == [(n, v, False) for n, v in expected]
    counts = totals.shard_counts_many([c for c, _, _ in first])
    assert [len(x) for x in counts] == [1, 5, 20, 9] and [sum(x) for x in counts] == [v for _, v in expected]
    assert [(c.name, t.count, t.cached) for c, t, _ in totals.list_counters()] == [(n, v, True) for n, v in expected]
    assert [c.name for c, _, _ in totals.list_counters(limit=2)] == ["a-one", "b-five"]
    # The page's form: shards of every counter in the same read, totals still from the cache where cached.
    runtime.cache().delete("counter-total:b-five")
    listed = totals.list_counters(with_shards=True)
    assert [(t.count, t.cached, len(sh), sum(sh)) for _, t, sh in listed] == [
        (3, True, 1, 3), (7, False, 5, 7), (11, True, 20, 11), (5, True, 9, 5)]
    assert totals.get_total("b-five") == totals.Total(7, True)  # re-cached from that read


def test_one_shard_counter_backs_off_and_stays_exact(ndb_context, backend):
    growth.configure("lonely", "general", 1)
    results = _hammer(lambda: service.increment("lonely"), threads=8, each=10)
    if backend == "legacy":
        assert sum(r.attempts for r in results) > 80  # they collided, and waited instead of spinning
    else:
        assert sum(r.attempts for r in results) == 80  # blind increments: no read, no lock, no collision
    assert CounterShard.key_for("lonely", 0).get().count == 80


def test_totals_of_counters_never_created_are_cached_and_then_follow_increments(ndb_context):
    own = service.owned("never")
    assert own.totals(["a", "b"]) == {"a": 0, "b": 0}
    assert runtime.cache().get_many(["counter-total:never:a", "counter-total:never:b"]) == {
        "counter-total:never:a": b"0", "counter-total:never:b": b"0"}
    own.increment("a")
    own.increment("a")
    assert own.totals(["a", "b"]) == {"a": 2, "b": 0}
