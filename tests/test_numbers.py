"""The numbers page: live measurements of Datastore and memcache operations, kept as the latest measurement."""
import threading

from google.cloud import ndb

from core import runtime
from latency import demo, service
from latency.models import Measurement, Probe
from tests.support import claimants_meet_at_the_claim, csrf_token


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
