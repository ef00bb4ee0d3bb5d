"""LATENCY=production (core/production_latency.py): the local stack waits production's modelled round trips, says so,
and is refused anywhere but against a local emulator."""
import random
import re
import statistics
import time

import pytest

from core import production_latency
from core.settings import Settings
from tests.support import make_app, running

LOCAL = {"DATASTORE_EMULATOR_HOST": "localhost:1"}
METRIC = re.compile(r'(?P<name>[a-z]+);(?:desc="[^"]*";)?dur=(?P<dur>[0-9.]+)')


def durations(server_timing):
    return {m["name"]: float(m["dur"]) for m in METRIC.finditer(server_timing)}


def test_the_model_is_off_by_default_and_only_for_a_local_emulator():
    assert Settings.from_env(LOCAL).latency == "none"
    assert Settings.from_env({**LOCAL, "LATENCY": "production"}).latency == "production"
    with pytest.raises(RuntimeError, match="none or production"):
        Settings.from_env({**LOCAL, "LATENCY": "fast"})
    with pytest.raises(RuntimeError, match="local emulator"):  # production waits by itself
        Settings.from_env({"SECRET_KEY": "s" * 32, "LATENCY": "production"})


def test_each_call_draws_around_its_median_with_a_bounded_tail():
    rng = random.Random(7)
    for trip in (*production_latency.DATASTORE.values(), production_latency.CACHE):
        draws = [trip.draw(rng) * 1000 for _ in range(4000)]
        assert 0.85 * trip.median_ms < statistics.median(draws) < 1.15 * trip.median_ms
        assert max(draws) <= 2 * trip.p99_ms and min(draws) > 0
        assert sorted(draws)[int(0.99 * len(draws))] == pytest.approx(trip.p99_ms, rel=0.25)
    off = production_latency.Model()
    assert off.before_rpc("Commit") == off.before_cache_call() == 0.0


def test_under_the_model_every_rpc_and_cache_call_waits_and_the_response_says_so(stack, client):
    """The same request with and without the model: under it, the Server-Timing `model` metric holds the waits, the
    Datastore and cache times include them, the wall time grows by them, and the footer says the model is on."""
    with running(make_app(stack, LATENCY="production", **stack.fresh())) as modelled:
        modelled_client = modelled.test_client()
        modelled_client.get("/counters")  # the first request fills the caches: both then answer the same way
        client.get("/counters")
        start = time.perf_counter()
        response = modelled_client.get("/counters")
        elapsed_ms = (time.perf_counter() - start) * 1000
    bare = client.get("/counters")
    assert "model;" not in bare.headers["Server-Timing"] and "latency model" not in bare.get_data(as_text=True)
    timing = durations(response.headers["Server-Timing"])
    rpcs = int(re.search(r'datastore;desc="(\d+) RPC', response.headers["Server-Timing"])[1])
    calls = int(re.search(r'cache;desc="(\d+) call', response.headers["Server-Timing"])[1])
    assert rpcs + calls > 0
    # every call waited at least a small fraction of its median, and the waits are part of the times measured
    assert timing["model"] > 0.2 * (rpcs * 4 + calls * 0.5)
    assert timing["datastore"] + timing["cache"] >= timing["model"] and elapsed_ms >= timing["model"]
    html = response.get_data(as_text=True)
    assert "Production latency model on" in html and "modelled production waits" in html


def test_a_transaction_under_the_model_holds_its_entity_group_for_its_round_trips(stack):
    """The waits come before each RPC is sent: a transaction's BeginTransaction, Lookup and Commit reach the emulator
    modelled round trips apart, so its window on the server grows as in production (here: a counter's increment,
    a transaction of a Lookup and a Commit, takes at least the model's minimum for those)."""
    with running(make_app(stack, LATENCY="production", **stack.fresh())) as modelled:
        client = modelled.test_client()
        client.post("/api/session", json={"email": "a@example.com", "admin": False})
        client.post("/api/counters/waits/increment")
        response = client.post("/api/counters/waits/increment")
    assert response.status_code == 200
    timing = durations(response.headers["Server-Timing"])
    assert timing["model"] >= 2  # at least two Datastore round trips of milliseconds each


def test_the_numbers_page_shows_the_model_and_says_when_it_measured_under_it(stack, client, auth):
    html = client.get("/numbers").get_data(as_text=True)
    assert "It is off in this" in html and "<th scope=\"row\">Commit</th><td class=\"num\">12" in html
    with running(make_app(stack, LATENCY="production", **stack.fresh())) as modelled:
        admin = modelled.test_client()
        admin.post("/api/session", json={"email": "boss@example.com", "admin": True})
        measured = admin.post("/api/numbers")
        page = admin.get("/numbers").get_data(as_text=True)
    assert measured.status_code == 201 and measured.get_json()["latency"] == "production"
    assert "It is on in this app" in page and "under the production latency model" in page
    # measured under the model, a transactional write takes at least a modelled Commit's typical share
    write = next(op for op in measured.get_json()["operations"] if op["name"] == "txn_write")
    assert write["median_ms"] >= 0.3 * production_latency.DATASTORE["Commit"].median_ms
