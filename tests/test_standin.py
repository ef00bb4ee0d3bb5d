"""The stand-in for production's Datastore (devstack/standin.py): one gRPC proxy in front of the real emulator that
every client reaches, waiting production's waits there and nowhere else. Many processes' writes to one entity take
turns in it and are refused past a bounded wait, as production refuses them; calls in flight together wait together;
the app's own processes wait for no Datastore RPC. Each test starts a stand-in of its own where it needs other knobs
(core/production_latency.KNOBS) than production's, so that the bound shows in a second, not a minute.
"""
import logging
import time
import uuid

import pytest
import requests
from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import costs, production_latency, runtime
from devstack.services import StandIn
from devstack.serving import app_env, instances, signed_in
from tests.standin_app import Tally
from tests.support import at_once, make_app, running

SECRET = "standin-test-secret"
ADMIN = "boss@example.com"
# One entity takes 5 writes a second after a burst of 1, and a commit waits at most 0.6 s for its turn: production's
# rule (core/production_latency.py: 1 a second after a burst of 3, 2 s) at a pace a test can see in a second.
TURNS = {"ENTITY_WRITES_PER_S": 5, "ENTITY_WRITE_BURST": 1, "ENTITY_TURN_MAX_WAIT_S": 1.0}
# A Lookup waits 30 ms more for each key after the first (production's: 0.5 ms): 10 keys wait 0.27 s more than one,
# far above what either emulator takes for them, so that the waits dominate what is timed.
SLOW_KEYS = {"LOOKUP_MS_PER_KEY": 30.0}


def test_two_workers_writes_to_one_entity_take_turns_and_are_aborted_past_the_bound(stack):
    """16 writes at once to one entity from two gunicorn workers (two servers of one worker each, as
    tests/test_processes.py serves, so that both surely write), each a single commit with no retry
    (tests/standin_app.py): they commit one after another at the entity's rate, and those whose turn cannot come
    within the bound are answered ABORTED with production's words; the entity holds the last committed write."""
    namespace, writers = f"s{uuid.uuid4().hex[:12]}", 16
    rate, burst, bound = TURNS["ENTITY_WRITES_PER_S"], TURNS["ENTITY_WRITE_BURST"], TURNS["ENTITY_TURN_MAX_WAIT_S"]
    with StandIn(stack.emulator, "production", knobs=TURNS) as standin:
        env = dict(app_env(stack, SECRET, latency="none"), LATENCY="production", DATASTORE_NAMESPACE=namespace,
                   DATASTORE_EMULATOR_HOST=standin.host)
        with instances(env, count=2, workers=1, app="tests.standin_app:app()") as servers:
            for server in servers:  # each worker's channels connected, and the emulator's first commit made
                assert requests.post(f"{server.url}/write/warm", timeout=30).json()["error"] is None
            answers = [answer for answer, _ in at_once(writers, lambda i: requests.post(
                f"{servers[i % 2].url}/write/hot?id={i}", timeout=30).json())]
    committed = sorted((a for a in answers if a["error"] is None), key=lambda a: a["at"])
    aborted = [a for a in answers if a["error"] is not None]
    assert len({a["pid"] for a in answers}) == 2  # both workers wrote
    # In turn: at most the burst, then one more each 1/rate, within the bound; the rest refused.
    assert 2 <= len(committed) <= burst + rate * bound + 1, answers
    assert committed[-1]["at"] - committed[0]["at"] >= (len(committed) - burst) / rate - 0.1, committed
    assert len(aborted) == writers - len(committed)
    assert all(a["error"] == f"ABORTED {production_latency.CONTENTION}" for a in aborted), aborted
    with running(make_app(stack, checked=False, DATASTORE_NAMESPACE=namespace)) as app:
        stored = runtime.of(app).in_context(lambda: ndb.Key(Tally, "hot").get())()
    assert stored.last == committed[-1]["id"]  # the writes landed in the order they were answered


def test_an_aborted_transaction_is_rolled_back_and_its_clients_rollback_answered(stack):
    """A transaction's commit refused for contention frees what the transaction read (the stand-in rolls it back on
    the emulator, as production's abort does: on Firestore its lock would hold the next writer), and the client's own
    Rollback after it (python-ndb sends one) is answered as production answers it: ndb raises the ABORTED, not an
    "expired transaction". Once the entity takes a write again, the next transaction commits at once."""
    knobs = {"ENTITY_WRITES_PER_S": 0.5, "ENTITY_WRITE_BURST": 1, "ENTITY_TURN_MAX_WAIT_S": 0.1}

    def read_and_write(last):
        Tally.get_by_id("t")  # a read in the transaction: on Firestore, a lock
        Tally(id="t", last=last).put()

    with StandIn(stack.emulator, "production", knobs=knobs) as standin, \
            running(make_app(stack, checked=False, LATENCY="production", DATASTORE_EMULATOR_HOST=standin.host,
                             **stack.fresh())) as app, runtime.of(app).context():
        Tally(id="warm", last=0).put(retries=0)  # the emulator's first commit (slow) made before anything counts
        Tally(id="t", last=0).put(retries=0)  # the burst spent: the next write's turn is two seconds away
        with pytest.raises(core_exceptions.Aborted, match="Too much contention"):
            ndb.transaction(lambda: read_and_write(1), retries=0)
        time.sleep(1 / knobs["ENTITY_WRITES_PER_S"])
        started = time.perf_counter()
        ndb.transaction(lambda: read_and_write(2), retries=0)
        assert time.perf_counter() - started < 1.0  # no lock left behind by the aborted one
        assert Tally.get_by_id("t").last == 2


def test_three_ndb_futures_in_flight_wait_together(stack):
    """Three Lookups that ndb has in flight at once (three batches: their options differ) wait their round trips
    side by side in the stand-in: the three take about as long as one, not as long as the three waits added up."""
    with StandIn(stack.emulator, "production", knobs=SLOW_KEYS, seed=71) as standin, \
            running(make_app(stack, checked=False, LATENCY="production", DATASTORE_EMULATOR_HOST=standin.host,
                             **stack.fresh())) as app, runtime.of(app).context():
        keys = [ndb.Key(Tally, f"k{i}") for i in range(30)]
        ndb.get_multi(keys[:1])  # the channel connected before anything is timed
        with costs.measured() as cost:
            started = time.perf_counter()
            futures = [f for i in range(3) for f in ndb.get_multi_async(keys[i * 10:(i + 1) * 10], timeout=30 + i)]
            ndb.wait_all(futures)
            wall = time.perf_counter() - started
    assert cost.datastore["Lookup"] == 3
    print(f"three Lookups in flight: {wall:.3f} s; the stand-in waited {cost.waited_s:.3f} s in all")
    assert cost.waited_s >= 3 * 0.2  # each waited its 10 keys' round trip (~0.3 s), less the emulator's time
    # together, the three end about when the quickest does; one after another, the last ends three round trips in
    durations = [(call.end_ms - call.start_ms) / 1000 for call in cost.kept_calls() if call.name == "Lookup"]
    assert len(durations) == 3 and wall < 2 * min(durations), (wall, durations)


def test_no_datastore_rpc_waits_in_the_apps_own_process(stack, caplog, monkeypatch):
    """The app's time for an RPC is the stand-in's wait plus the emulator's, the wait as the stand-in reports it, and
    the app's process sleeps not at all for it; the same app under the same profile, pointed at the bare emulator,
    waits nothing at all (and says why)."""
    slept = []

    def one_lookup(app):
        # every sleep of this process while the RPC is made, seen
        with runtime.of(app).context(), costs.measured() as cost, monkeypatch.context() as watched:
            watched.setattr(time, "sleep", lambda seconds: slept.append(seconds))
            ndb.get_multi([ndb.Key(Tally, f"k{i}") for i in range(10)], use_cache=False)
        (call,) = cost.kept_calls()
        return cost.waited_s, (call.end_ms - call.start_ms) / 1000

    fresh = stack.fresh()
    with StandIn(stack.emulator, "production", knobs=SLOW_KEYS) as standin, \
            running(make_app(stack, checked=False, LATENCY="production", DATASTORE_EMULATOR_HOST=standin.host,
                             **fresh)) as app:
        one_lookup(app)  # connected
        waited, rpc_s = one_lookup(app)
    assert 0.2 <= waited <= rpc_s < waited + 0.15, (waited, rpc_s)
    assert slept == []
    with caplog.at_level(logging.WARNING, logger="core.datastore"), \
            running(make_app(stack, checked=False, LATENCY="production", DATASTORE_EMULATOR_HOST=stack.emulator.host,
                             **fresh)) as bare:
        one_lookup(bare)
        waited, rpc_s = one_lookup(bare)
    assert waited == 0.0 and rpc_s < 0.1 and slept == [], (waited, rpc_s, slept)
    assert "answered without the stand-in's wait" in caplog.text


def test_the_adaptive_counter_grows_on_firestore_under_production(firestore_stack):
    """LATENCY=production, served by two workers: one entity takes production's one write a second (after its burst),
    so an adaptive counter's blind increments collide on Firestore too, and it grows past one shard."""
    namespace, name = f"s{uuid.uuid4().hex[:12]}", f"grows-{uuid.uuid4().hex[:6]}"
    env = dict(app_env(firestore_stack, SECRET, admins=ADMIN, latency="production"), DATASTORE_NAMESPACE=namespace)
    with instances(env, count=1, workers=2) as (server,):
        admin = signed_in(server.url, ADMIN, admin=True)
        assert admin.put(f"{server.url}/api/counters/{name}", json={"mode": "adaptive"}, timeout=30).ok
        bursts = at_once(2, lambda _: signed_in(server.url, ADMIN, admin=True).post(
            f"{server.url}/api/counters/{name}/burst", json={"writers": 16, "increments": 48}, timeout=120).json())
        counter = admin.get(f"{server.url}/api/counters/{name}", timeout=30).json()
    done = sum(burst["increments"] for burst, _ in bursts)
    print(f"adaptive counter on Firestore: {done} increments in {max(t for _, t in bursts):.1f} s, "
          f"{sum(burst['attempts'] for burst, _ in bursts)} attempts, {counter['num_shards']} shards")
    assert counter["num_shards"] > 1, (counter, bursts)
    assert done > 0 and counter["count"] >= done  # every counted increment is in it (the cached total may lag less)
