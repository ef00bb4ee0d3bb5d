"""LATENCY=production and LATENCY=multi-region (core/production_latency.py): the local stack waits production's
round trips as published, tails and all (Datastore RPCs in the stand-in, devstack/standin.py: tests/test_standin.py),
says which profile is on, and is refused anywhere but against a local emulator."""
import random
import re
import time

import pytest
from google.cloud import ndb

from core import costs, production_latency, runtime
from core.production_latency import SHAPE, Model
from core.settings import Settings
from devstack.services import StandIn
from tests.support import Tasks, make_app, running

LOCAL = {"DATASTORE_EMULATOR_HOST": "localhost:1"}
METRIC = re.compile(r'(?P<name>[a-z]+);(?:desc="[^"]*";)?dur=(?P<dur>[0-9.]+)')


def durations(server_timing):
    return {m["name"]: float(m["dur"]) for m in METRIC.finditer(server_timing)}


def quantile(values, q):
    return sorted(values)[int(q * len(values))]


def test_the_model_is_off_by_default_has_two_profiles_and_is_only_for_a_local_emulator():
    assert Settings.from_env(LOCAL).latency == "none"
    for profile in ("production", "multi-region"):
        assert Settings.from_env({**LOCAL, "LATENCY": profile}).latency == profile
    with pytest.raises(RuntimeError, match="none, production, multi-region"):
        Settings.from_env({**LOCAL, "LATENCY": "fast"})
    with pytest.raises(RuntimeError, match="local emulator"):  # production waits by itself
        Settings.from_env({"SECRET_KEY": "s" * 32, "LATENCY": "multi-region"})
    with pytest.raises(ValueError, match="LATENCY"):
        Model("regional")


def test_the_figures_are_the_published_ones():
    """The medians of google-cloud-dotnet#5333 and the tail of nodejs-firestore#1994's histogram, scaled: a change of
    a figure here must be a change of its source too."""
    model = Model("production")
    assert {m: model.datastore[m].median_ms for m in ("Lookup", "RunQuery", "Commit")} == {
        "Lookup": 14.5, "RunQuery": 19, "Commit": 47}
    lookup = model.datastore["Lookup"]
    # the published strong reads' GetDocument histogram, its steps 1 - 2**-k, divided by its 17 ms median
    assert lookup.quantile_ms(1 - 2 ** -10) == pytest.approx(14.5 * 86 / 17)
    assert lookup.quantile_ms(1 - 2 ** -7) == pytest.approx(14.5 * 32 / 17)
    # no cap below the last published step (1,326 ms for a 17 ms median)
    for trip in (*model.datastore.values(), production_latency.TASK_CREATE, production_latency.TASK_DELIVERY):
        assert trip.cap_ms == pytest.approx(trip.median_ms * 1326 / 17)
    assert Model("multi-region").datastore["Commit"].median_ms > model.datastore["Commit"].median_ms
    assert Model("multi-region").datastore["Lookup"] == model.datastore["Lookup"]  # reads: the nearest replica
    rows = {row["call"]: row for row in Model("multi-region").describe()}
    assert "dotnet#5333" in rows["Lookup"]["source"] and "inference" in rows["Commit"]["source"]
    assert "inference" in rows["cache call (through the VPC connector)"]["source"]


def test_each_call_draws_its_published_quantiles_tail_included():
    rng = random.Random(7)
    for trip in (production_latency.LOOKUP, production_latency.COMMIT, production_latency.MULTI_REGION_COMMIT,
                 production_latency.CACHE):
        draws = [trip.draw(rng) * 1000 for _ in range(40_000)]
        assert quantile(draws, 0.5) == pytest.approx(trip.median_ms, rel=0.05)
        assert quantile(draws, 0.99) == pytest.approx(trip.p99_ms, rel=0.15)
        assert quantile(draws, 0.999) == pytest.approx(trip.p999_ms, rel=0.2)  # 40 draws above it
        assert trip.p999_ms < max(draws) <= trip.cap_ms and min(draws) > 0  # the published tail is reached
    # the tail is the published one: a Lookup's p99.9 is more than 5 times its median, as the histogram's
    assert production_latency.LOOKUP.p999_ms > 5 * production_latency.LOOKUP.median_ms
    off = Model()
    assert off.datastore_round_trip("Commit") == off.before_cache_call() == off.before_task_create() == 0.0
    assert off.scan(10_000) == 0.0
    assert [p for p, _ in SHAPE] == sorted(p for p, _ in SHAPE)


class Waits:
    def __init__(self):
        self.seconds = 0.0

    def add_wait(self, seconds):
        self.seconds += seconds


def test_every_kind_of_wait_in_the_apps_process_is_slept_and_kept():
    """Cache calls and Cloud Tasks wait in the app's process; Datastore RPCs only draw here (the stand-in waits)."""
    model, waits = Model("production"), Waits()
    for wait in (model.before_task_create, model.before_task_delivery, model.before_cache_call):
        start = time.perf_counter()
        waited = wait(waits)
        assert time.perf_counter() - start >= waited > 0
    assert model.scan(4000) == pytest.approx(4 * production_latency.SCAN_MS_PER_1000_ENTRIES / 1000)
    start = time.perf_counter()
    assert model.datastore_round_trip("Lookup") > 0 and time.perf_counter() - start < 0.005  # drawn, not slept


def test_a_batch_waits_more_with_its_size_and_a_seed_repeats_the_draws():
    """A Lookup's round trip grows with its keys and a Commit's with its mutations (each after the first: one round
    trip for the batch); LATENCY_SEED's draws are the same run after run."""
    first, second = Model("production", seed=5), Model("production", seed=5)
    draws = [(first.datastore_round_trip("Lookup", keys=1000), second.datastore_round_trip("Lookup")) for _ in range(3)]
    for big, small in draws:
        assert big - small == pytest.approx(999 * production_latency.LOOKUP_MS_PER_KEY / 1000)
    assert (Model("production", seed=5).datastore_round_trip("Commit", mutations=500)
            - Model("production", seed=5).datastore_round_trip("Commit")) == pytest.approx(
        499 * production_latency.COMMIT_MS_PER_MUTATION / 1000)
    assert production_latency.seed_from({"LATENCY_SEED": "42"}) == 42 and production_latency.seed_from({}) is None
    # read once with the other settings, and so each app's runtime draws from it (core/runtime.py)
    assert Settings.from_env({"DATASTORE_EMULATOR_HOST": "127.0.0.1:1", "LATENCY_SEED": "42"}).latency_seed == 42


def test_under_the_model_every_rpc_and_cache_call_waits_and_the_response_says_which_profile(stack, client):
    """The same request with and without the model: under it, the Server-Timing `model` metric holds the waits (the
    cache calls' and what the stand-in reported for the RPCs), the Datastore and cache times include them, every RPC
    takes at least its round trip, the wall time grows by them, and the footer names the profile."""
    with running(make_app(stack, LATENCY="multi-region", **stack.fresh())) as modelled:
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
    # every call took at least its lowest draw (about 0.45 of its median): an RPC's round trip counts the emulator's
    # own time toward its wait (the stand-in's), a cache call waits in full; the waits are part of the times
    assert timing["datastore"] > 0.4 * rpcs * 14.5 and timing["model"] > 0.4 * calls * 1.0
    assert timing["datastore"] + timing["cache"] >= timing["model"] and elapsed_ms >= timing["model"]
    assert 'model;desc="LATENCY=multi-region' in response.headers["Server-Timing"]
    html = response.get_data(as_text=True)
    assert "Production latency model on" in html and "modelled production waits, LATENCY=multi-region" in html


def test_a_transaction_under_the_model_holds_its_entity_group_for_its_round_trips(stack):
    """Half of each wait comes before the stand-in forwards the RPC: a transaction's BeginTransaction, Lookup and
    Commit reach the emulator modelled round trips apart, so its window on the server grows as in production (here:
    a counter's increment, at least a Lookup's and a Commit's lowest draws)."""
    with running(make_app(stack, LATENCY="production", **stack.fresh())) as modelled:
        client = modelled.test_client()
        client.post("/api/session", json={"email": "a@example.com", "admin": False})
        client.post("/api/counters/waits/increment")
        response = client.post("/api/counters/waits/increment")
    assert response.status_code == 200
    timing = durations(response.headers["Server-Timing"])
    assert timing["datastore"] >= 0.4 * (14.5 + 47)
    assert 'model;desc="LATENCY=production' in response.headers["Server-Timing"]


def test_creating_a_task_and_delivering_it_wait_under_the_model(stack):
    """Cloud Tasks' create and delivery wait too: enqueueing waits a CreateTask, and the delivered request waits its
    delivery first, each kept in the request's waits."""
    with running(make_app(stack, LATENCY="production", **stack.fresh())) as modelled:
        rt = runtime.of(modelled)
        seen = []
        rt.tasks.register("latency.probe", lambda payload, attempt: seen.append(payload))
        with costs.measured() as cost:
            rt.tasks.enqueue("latency.probe", {"n": 1}, "probe-1")
        assert cost.waited_s >= 0.4 * production_latency.TASK_CREATE.median_ms / 1000
        queue = Tasks(modelled)
        assert queue.drain() == 1
    assert seen == [{"n": 1}] and queue.responses[0][1] == 200
    assert durations(queue.timings[0])["model"] >= 0.4 * production_latency.TASK_DELIVERY.median_ms


def test_an_aggregation_waits_in_proportion_to_the_index_entries_it_counts(firestore_stack):
    """RunAggregationQuery's round trip grows with the entries its COUNT scanned (Firestore in Datastore mode: the
    legacy emulator has no aggregations). The scan rate raised in a stand-in of its own (its knob) so that 300 entries
    take 3 s, far above what this machine's emulator takes to count them even when the machine is busy: the emulator's
    own time counts toward the round trip (the stand-in waits the rest), so a smaller figure would let a loaded
    machine pass without the scan."""
    class Scanned(ndb.Model):
        _use_cache = _use_global_cache = False
        n = ndb.IntegerProperty()

    with StandIn(firestore_stack.emulator, "production", knobs={"SCAN_MS_PER_1000_ENTRIES": 10_000}) as standin, \
            running(make_app(firestore_stack, checked=False, LATENCY="production",
                             DATASTORE_EMULATOR_HOST=standin.host, **firestore_stack.fresh())) as app:
        rt = runtime.of(app)
        took = {}
        for count in (0, 300):
            with rt.context():
                if count:
                    ndb.put_multi([Scanned(id=f"s{i}", n=1) for i in range(count)])
                with costs.measured() as cost:
                    assert rt.datastore.aggregations.count_and_sum("Scanned", "n") == (count, count)
                took[count] = cost.datastore_s
    # the round trip alone (at most its cap, and this machine's time: a second when busy) against 3 s of scanning
    assert took[0] <= production_latency.RUN_AGGREGATION_QUERY.cap_ms / 1000 + 1.0
    assert took[300] >= 3.0


def test_the_numbers_page_shows_the_profile_its_figures_and_whose_they_are(stack, client):
    html = client.get("/numbers").get_data(as_text=True)
    assert "It is off in this" in html and '<th scope="row">Commit</th><td class="num">47' in html
    assert "google-cloud-dotnet#5333" in html and "nodejs-firestore#1994" in html and "inference" in html
    with running(make_app(stack, LATENCY="multi-region", **stack.fresh())) as modelled:
        admin = modelled.test_client()
        admin.post("/api/session", json={"email": "boss@example.com", "admin": True})
        measured = admin.post("/api/numbers")
        page = admin.get("/numbers").get_data(as_text=True)
    assert measured.status_code == 201 and measured.get_json()["latency"] == "multi-region"
    assert "It is on in this app" in page and "<code data-profile>LATENCY=multi-region</code>" in page
    assert '<th scope="row">Commit</th><td class="num">100' in page  # the multi-region profile's Commit
    # measured under the model, a transactional write takes at least a modelled Commit's lowest draws
    write = next(op for op in measured.get_json()["operations"] if op["name"] == "txn_write")
    assert write["median_ms"] >= 0.4 * production_latency.MULTI_REGION_COMMIT.median_ms
