"""The numbers page: live measurements of Datastore and memcache operations, kept as the latest measurement."""
import re
import threading

import pytest
from google.cloud import ndb

from core import production_latency, runtime
from latency import demo, service
from latency.models import Measurement, Probe
from tests.support import claimants_meet_at_the_claim, csrf_token, make_app, running


def _stored(kind):
    with runtime.current().context():
        return kind.query().fetch(keys_only=True)


def test_nothing_measured_yet(client):
    r = client.get("/api/numbers")
    assert r.status_code == 404 and r.get_json()["error"]["code"] == "not_measured"
    assert "Nothing was measured yet" in client.get("/numbers").get_data(as_text=True)


def test_only_admins_measure_and_bad_requests_change_nothing(client, auth):
    assert client.post("/api/numbers").status_code == 401
    auth.sign_in()
    assert client.post("/api/numbers").status_code == 403
    token = csrf_token(client, "/numbers")
    assert client.post("/numbers", data={"csrf_token": token}).status_code == 403
    assert "Measure again" not in client.get("/numbers").get_data(as_text=True)
    auth.admin()
    assert client.post("/api/numbers", data="x=1", content_type="application/x-www-form-urlencoded").status_code == 415
    assert client.post("/numbers").status_code == 400  # no CSRF token
    assert _stored(Measurement) == [] and _stored(Probe) == []


def test_admin_measures_every_operation(client, auth):
    auth.admin()
    r = client.post("/api/numbers")
    assert r.status_code == 201
    numbers = r.get_json()
    assert [op["name"] for op in numbers["operations"]] == [op.name for op in service.OPERATIONS]
    for op in numbers["operations"]:
        assert 0 < op["median_ms"] <= op["p90_ms"], op
        assert 1 <= op["runs"] <= service.RUNS
    by_name = {op["name"]: op for op in numbers["operations"]}
    assert by_name["get_multi"]["per_item_ms"] == round(by_name["get_multi"]["median_ms"] / service.BATCH, 3)
    assert by_name["txn_write"]["talk_ms"] == 10.0
    assert numbers["write_read_ratio"] == round(by_name["txn_write"]["median_ms"] / by_name["get"]["median_ms"], 1)
    assert numbers["by"] == "boss"
    assert client.get("/api/numbers").get_json() == numbers

    html = client.get("/numbers").get_data(as_text=True)
    for op in numbers["operations"]:
        assert f'data-op="{op["name"]}"' in html and f'{op["median_ms"]:.2f}' in html
    assert "Measure again" in html


def test_who_measured_is_shown_to_visitors_by_display_name_only(app, client, auth):
    """Anyone reads /numbers and /api/numbers: an admin's address there is a target (phishing, the admin list)."""
    auth.admin()
    assert client.post("/api/numbers").status_code == 201
    auth.sign_out()
    visitor = app.test_client()
    assert visitor.get("/api/numbers").get_json()["by"] == "boss"
    assert "boss@example.com" not in visitor.get("/numbers").get_data(as_text=True)
    with runtime.current().context():  # a measurement kept with an address (before display names) shows none either
        measurement = ndb.Key(Measurement, service.LATEST).get()
        measurement.by = "boss@example.com"
        measurement.put()
    assert visitor.get("/api/numbers").get_json()["by"] == "boss"
    assert "boss@example.com" not in visitor.get("/numbers").get_data(as_text=True)


def test_measuring_again_replaces_the_figures_and_writes_no_more_probes(client, auth):
    auth.admin()
    first = client.post("/api/numbers").get_json()
    probes = len(_stored(Probe))
    assert probes == service.BATCH + service.RUNS + 1  # the batch and the rotating single-entity writes
    token = csrf_token(client, "/numbers")
    r = client.post("/numbers", data={"csrf_token": token})
    assert r.status_code == 302 and r.headers["Location"] == "/numbers"
    second = client.get("/api/numbers").get_json()
    assert second["operations"] != first["operations"]  # timings of a second run (equal to the microsecond: no)
    assert len(_stored(Probe)) == probes and len(_stored(Measurement)) == 1


def test_one_measurement_at_a_time(app, auth, client, monkeypatch):
    """Two admins ask at once, and neither goes on from its first call on the claim before both have been answered
    (claimants_meet_at_the_claim): one measures, the other is a 409; a claim read, then written, would let both
    measure."""
    auth.admin()
    claimants_meet_at_the_claim(monkeypatch, runtime.of(app).cache, service.LOCK_KEY)
    results = []
    barrier = threading.Barrier(2)

    def measure():
        c = app.test_client()
        c.post("/api/session", json={"email": "boss@example.com", "admin": True})
        barrier.wait()
        r = c.post("/api/numbers")
        results.append((r.status_code, r.get_json()))
    threads = [threading.Thread(target=measure) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(code for code, _ in results) == [201, 409]
    assert [body for code, body in results if code == 409][0]["error"]["code"] == "measuring"
    assert client.post("/api/numbers").status_code == 201  # the claim was released


def test_measures_while_memcached_is_down(client, auth, stack):
    auth.admin()
    stack.cache.stop()
    try:
        r = client.post("/api/numbers")
        assert r.status_code == 201
        by_name = {op["name"]: op for op in r.get_json()["operations"]}
        assert by_name["memcache_get"]["median_ms"] is None and by_name["get"]["median_ms"] > 0
        html = client.get("/numbers").get_data(as_text=True)
        assert "unreachable" in html
    finally:
        stack.cache.start()
    with runtime.current().context():
        assert ndb.Key(Measurement, service.LATEST).get() is not None


def test_seed_measures_once(app, ndb_context):
    assert demo.seed() is True
    assert service.latest()["by"] == "seed"
    assert demo.seed() is False


# --- the stand-in's figures (core/production_latency.py), on the page and as JSON -----------------------------------

def test_every_knob_of_the_stand_in_is_one_of_its_figures():
    """Every number core/production_latency.py keeps at its top level is one of the stand-in's knobs: a figure added
    without a Knob (its label, whose it is, its sources) would be missing from /numbers."""
    numbers = {name for name, value in vars(production_latency).items()
               if name.isupper() and isinstance(value, int | float) and not isinstance(value, bool)}
    assert numbers == set(production_latency.KNOBS)


def test_numbers_shows_every_figure_the_stand_in_waits_by(client):
    """/api/numbers/standin and /numbers show each knob, each RPC's median round trip under each profile and the
    tail's steps, each figure core/production_latency.py's, whose it is (published or an inference) and its sources:
    a knob left out, or a figure other than the module's, fails."""
    got = client.get("/api/numbers/standin").get_json()
    assert got["profile"] == "none"
    assert [knob["name"] for knob in got["knobs"]] == list(production_latency.KNOBS)
    for knob in got["knobs"]:
        assert knob["value"] == getattr(production_latency, knob["name"]), knob
        # Google publishes one entity's rate; the burst, the bound and a batch's size terms are inferences
        assert knob["whose"] == ("published" if knob["name"] == "ENTITY_WRITES_PER_S" else "inference"), knob
        assert knob["links"] and all(link.startswith("https://") for link in knob["links"]), knob
    rate = next(knob for knob in got["knobs"] if knob["name"] == "ENTITY_WRITES_PER_S")
    assert "https://cloud.google.com/firestore/docs/solutions/counters" in rate["links"]
    assert [trip["method"] for trip in got["round_trips"]] == list(production_latency.DATASTORE)
    for trip in got["round_trips"]:
        for profile in production_latency.PROFILES:
            model = production_latency.PROFILE_DATASTORE[profile][trip["method"]]
            assert trip["median_ms"][profile] == model.median_ms, (trip, profile)
    by_method = {trip["method"]: trip for trip in got["round_trips"]}
    assert by_method["Commit"]["whose"] == {"production": "published", "multi-region": "inference"}
    assert by_method["Lookup"]["links"] == ["https://github.com/googleapis/google-cloud-dotnet/issues/5333"]
    assert by_method["BeginTransaction"]["whose"] == {"production": "inference", "multi-region": "inference"}
    steps = got["tail"]["steps"]
    assert steps[0] == {"quantile": 0.5, "ms": steps[0]["ms"], "ratio": 1.0}
    assert [(s["quantile"], s["ratio"]) for s in steps[1:]] == [(q, round(r, 4)) for q, r in production_latency.SHAPE]
    assert got["tail"]["links"] == ["https://github.com/googleapis/nodejs-firestore/issues/1994"]

    html = client.get("/numbers").get_data(as_text=True)
    for knob in got["knobs"]:
        row = re.search(rf'<tr data-knob="{knob["name"]}">(.*?)</tr>', html, re.S)
        assert row, knob["name"]
        said = "production&#39;s, published" if knob["whose"] == "published" else "an inference"
        assert f'data-knob-value>{knob["value"]:g} {knob["unit"]}<' in row[1], row[1]
        assert f"data-standin-whose>{said}<" in row[1], row[1]
        assert all(f'href="{link}"' in row[1] for link in knob["links"])
    for trip in got["round_trips"]:
        row = re.search(rf'<tr data-round-trip="{trip["method"]}">(.*?)</tr>', html, re.S)
        assert row, trip["method"]
        for profile in production_latency.PROFILES:
            assert re.search(rf'data-profile-median="{profile}">{trip["median_ms"][profile]:g}\s', row[1]), row[1]
    ratios = re.findall(r"data-tail-ratio>([\d.]+)<", html)
    assert [float(r) for r in ratios] == pytest.approx([s["ratio"] for s in steps], rel=1e-3)


def test_the_stand_ins_figures_name_the_apps_profile(stack):
    """Under a profile the figures say which one this app waits under."""
    with running(make_app(stack, LATENCY="production", **stack.fresh())) as modelled:
        assert modelled.test_client().get("/api/numbers/standin").get_json()["profile"] == "production"
