"""Appstats (core/costs.py): every response says what it cost in its Server-Timing header, pages in their footer,
one log line per request (Cloud Logging's JSON on App Engine, with the trace id), and admins see the last requests."""
import json
import logging
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from google.cloud import ndb

from appstats import accounting, captures
from bench import overhead
from core import costs, runtime
from core.costs import Cost
from devstack.apps import app_on
from devstack.services import StandIn
from devstack.serving import app_env, instances, signed_in
from devstack.taskqueue import DrainedQueue
from tests.support import ON_APP_ENGINE, Auth, csrf_token, make_app, running, settings_for, timing

ADMIN = "boss@example.com"
SECRET = "appstats-test-secret"


def rpcs(response):
    return timing(response)["datastore"][0]


def test_every_answer_says_what_it_cost(client, auth, stack):
    """HTML and JSON, 2xx, 4xx and 5xx alike."""
    app = client.application

    @app.get("/boom")
    def boom():
        raise RuntimeError("on purpose")

    auth.sign_in()
    answers = {"html": client.get("/counters"), "json": client.get("/api/counters"),
               "404": client.get("/api/counters/absent"), "400": client.get("/api/blogs/BAD!/entries"),
               "405": client.put("/api/openapi.json", json={}), "500": client.get("/boom"),
               "created": client.post("/api/counters/new/increment")}
    assert [a.status_code for a in answers.values()] == [200, 200, 404, 400, 405, 500, 200]
    for what, response in answers.items():
        found = timing(response)
        assert set(found) == {"datastore", "cache", "app"}, (what, response.headers["Server-Timing"])
        assert found["app"] > 0
    # what each one did, by method: the increment's transaction on legacy, a blind commit on Firestore
    increment = timing(answers["created"])["datastore"][1]
    assert increment.get("Commit", 0) >= 1 and increment.get("Lookup", 0) >= 1, increment
    assert timing(answers["json"])["datastore"][1] == {"RunQuery": 1}, answers["json"].headers["Server-Timing"]


def test_the_global_caches_calls_are_counted_with_the_apps(client, auth, stack):
    """A counter config is in ndb's global cache: its first read misses there and reads Datastore, the next is served
    by the cache alone, and both show the cache calls ndb made."""
    auth.admin()
    client.put("/api/counters/g", json={"mode": "general", "num_shards": 2})
    runtime.of(client.application).cache.flush()
    first, second = client.get("/api/counters/g"), client.get("/api/counters/g")
    assert timing(first)["datastore"][1].get("Lookup", 0) >= 1 and timing(first)["cache"][0] >= 2
    assert timing(second)["datastore"][0] == 0, second.headers["Server-Timing"]
    assert timing(second)["cache"][0] >= 1


def test_the_footer_shows_the_pages_cost_and_admins_see_the_last_requests(client, auth, stack):
    page = client.get("/counters").get_data(as_text=True)
    figures = r"\d+ Datastore RPCs? \([\d.]+ ms\), \d+ \w+ calls? \([\d.]+ ms\)"
    assert re.search(r"this page: <span data-cost>" + figures, page), page[-600:]
    assert "recent requests" not in page
    assert client.get("/appstats").status_code == 401 and client.get("/api/appstats").status_code == 401
    # A visitor's page says what Appstats is and where their own figures are, without the list.
    visitor = client.get("/appstats").get_data(as_text=True)
    assert "data-admins-only" in visitor and "Server-Timing" in visitor and "data-appstats-table" not in visitor
    auth.sign_in()
    assert client.get("/api/appstats").status_code == 403
    signed_in = client.get("/appstats")
    assert signed_in.status_code == 403 and "data-admins-only" in signed_in.get_data(as_text=True)
    auth.admin()
    client.get("/api/counters/x")  # a 404, recorded like any other
    recent = client.get("/api/appstats").get_json()
    assert recent["size"] == 100
    newest = recent["requests"][0]
    assert (newest["method"], newest["path"], newest["status"]) == ("GET", "/api/counters/x", 404)
    assert newest["datastore"]["rpcs"] == sum(newest["datastore"]["by_method"].values())
    # the cache's figures under one fixed key, whichever cache it is; its name is a value
    assert newest["cache"]["backend"] == stack.cache.backend and "memcached" not in newest and "redis" not in newest
    assert newest["cache"]["calls"] == sum(newest["cache"]["by_call"].values())
    html = client.get("/appstats").get_data(as_text=True)
    assert "GET /api/counters/x" in html and "recent requests" in html


def test_the_recent_requests_are_bounded(client, auth, monkeypatch):
    """The listing shows the last LISTED; the cache holds the last RING (a ring of keys, each written over in turn),
    so Appstats takes a bounded part of the cache however busy the app is, and an older id says it is gone."""
    monkeypatch.setattr(captures, "RING", 150)
    auth.admin()
    client.get("/healthz")
    first = client.get("/api/appstats").get_json()["requests"][0]
    assert first["path"] == "/healthz"
    for _ in range(160):
        client.get("/healthz")
    listed = client.get("/api/appstats").get_json()["requests"]
    assert len(listed) == captures.LISTED == 100 and len({r["id"] for r in listed}) == 100
    assert [r["id"] for r in listed] == sorted((r["id"] for r in listed), reverse=True)
    gone = client.get(f"/api/appstats/{first['id']}")
    assert gone.status_code == 404 and gone.get_json()["error"]["code"] == "request_expired"


@pytest.fixture
def appstats_log():
    """The accounting's lines since the last call, as its loggers write them: one per request, whole, each a line
    of its own (locally to stderr, on App Engine to stdout, where Cloud Logging reads them)."""
    written = []

    class Kept(logging.Handler):
        def emit(self, record):
            written.append(record.getMessage())
    kept = Kept()
    for logger in (accounting.LOCAL_LINES, accounting.CLOUD_LINES):
        logger.addHandler(kept)

    def lines():
        found = list(written)
        written.clear()
        return found
    yield lines
    for logger in (accounting.LOCAL_LINES, accounting.CLOUD_LINES):
        logger.removeHandler(kept)


def test_a_local_request_logs_one_readable_line(client, appstats_log):
    client.get("/api/counters/x")
    lines = appstats_log()
    assert len(lines) == 1
    assert re.match(r"GET /api/counters/x 404 [\d.]+ ms \| datastore \d+ RPCs? [\d.]+ ms \(.*Lookup.*\) \| ", lines[0])


def test_a_local_line_says_a_path_with_format_marks_as_it_came(client, appstats_log):
    """The line is a %-template per request line (its path fixed in it): a path's own % is not a slot."""
    client.get("/x%25s%25(app_ms).1f%25%25")
    lines = appstats_log()
    assert len(lines) == 1 and re.match(r"GET /x%s%\(app_ms\)\.1f%% 404 [\d.]+ ms \| datastore 0 RPCs ", lines[0])


def test_a_path_cannot_forge_a_log_line(client, appstats_log):
    """The path is logged decoded: %0a would end the line and let the rest pose as another request's."""
    client.get("/x%0aGET%20/api/session%20200%0d%1b[2J")
    lines = appstats_log()
    assert len(lines) == 1 and "\r" not in lines[0] and "\x1b" not in lines[0]
    assert lines[0].startswith("GET /x\\x0aGET /api/session 200\\x0d\\x1b[2J 404 ")


@pytest.fixture
def gae_app(stack):
    app = app_on(stack, task_queue=DrainedQueue(), **stack.emulator.fresh(), **ON_APP_ENGINE,
                 DATASTORE_DATASET="scalable-demo")
    with running(app):
        yield app


def test_on_app_engine_one_structured_line_carries_the_trace(gae_app, appstats_log):
    before = time.time()
    r = gae_app.test_client().get("/api/counters/x", headers={
        "X-Cloud-Trace-Context": "105445aa7843bc8bf206b12000100000/1;o=1"})
    entries = [json.loads(line) for line in appstats_log()]
    assert len(entries) == 1
    entry = entries[0]
    assert entry["logging.googleapis.com/trace"] == "projects/scalable-demo/traces/105445aa7843bc8bf206b12000100000"
    # the header's decimal span id, as Cloud Logging's 16 hex digits
    assert entry["logging.googleapis.com/spanId"] == "0000000000000001"
    assert entry["logging.googleapis.com/trace_sampled"] is True
    assert entry["severity"] == "INFO" and entry["httpRequest"]["status"] == r.status_code == 404
    # dated when it was served, not when the writer wrote it
    assert before <= entry["timestamp"]["seconds"] + entry["timestamp"]["nanos"] / 1e9 <= time.time()
    assert entry["appstats"]["datastore"]["rpcs"] == timing(r)["datastore"][0] >= 1


def test_a_clients_trace_header_is_used_only_when_well_formed(gae_app, appstats_log):
    """App Engine passes on an X-Cloud-Trace-Context a client sent: one that is not TRACE_ID/SPAN_ID;o=N is ignored
    (it once went into the log entry as it came)."""
    for header in ("not-a-trace/1;o=1", "105445aa7843bc8bf206b12000100000/1;o=1 forged", "../../x",
                   "105445aa7843bc8bf206b12000100000/99999999999999999999999;o=1"):
        gae_app.test_client().get("/healthz", headers={"X-Cloud-Trace-Context": header})
        [line] = appstats_log()
        entry = json.loads(line)
        assert "logging.googleapis.com/trace" not in entry and "logging.googleapis.com/spanId" not in entry, header


def test_a_structured_line_is_its_requests_entry_whatever_the_path_or_project(gae_app, appstats_log):
    """Each entry is a template made once per request line and mix of calls, its numbers put in per request: a path or
    a project with %, quotes, backslashes or line breaks in it still gives one line of JSON, with them as they were
    and this request's own times."""
    client = gae_app.test_client()
    for path, url in (("/x%25s%25(app_ms).1f", "/x%s%(app_ms).1f"), ('/x%22%5C%0a%7B', '/x"\\\n{'),
                      ("/healthz", "/healthz")):
        before = time.time()
        first = client.get(path, headers={"X-Cloud-Trace-Context": "105445aa7843bc8bf206b12000100000/255;o=0"})
        second = client.get(path)
        [one, two] = [json.loads(line) for line in appstats_log()]
        assert one["httpRequest"]["requestUrl"] == two["httpRequest"]["requestUrl"] == url
        assert one["httpRequest"]["status"] == first.status_code and two["httpRequest"]["status"] == second.status_code
        assert before <= one["timestamp"]["seconds"] + one["timestamp"]["nanos"] / 1e9 <= time.time()
        assert one["logging.googleapis.com/spanId"] == "00000000000000ff"
        assert one["logging.googleapis.com/trace_sampled"] is False and "logging.googleapis.com/trace" not in two
        for entry, response in ((one, first), (two, second)):  # its own figures, as its header said them
            said = timing(response)
            assert entry["appstats"]["app_ms"] == said["app"] and entry["appstats"]["cache"]["ms"] == said["cache"][2]
            assert entry["appstats"]["cache"]["calls"] == said["cache"][0]


def test_a_header_value_cannot_be_made_of_a_name_that_breaks_its_line():
    """The Server-Timing value is made of the code's own names (RPC methods, cache calls): a line break in one
    would end the header and start another, so it never reaches the value."""
    for add in (lambda cost: cost.add_cache("get\r\nSet-Cookie: x=1", time.perf_counter()),
                lambda cost: cost.add_rpc("Lookup\nX: 1", time.perf_counter())):
        cost = Cost()
        add(cost)
        value = cost.server_timing()
        assert not costs.CONTROL.search(value) and "datastore;" in value, value


def test_a_cost_keeps_each_calls_times_up_to_its_bound():
    """Each call is kept with when it started and ended, from the request's start, for the request's timeline; past
    MOST_CALLS they are counted and no longer kept."""
    cost = Cost()
    for i in range(costs.MOST_CALLS + 5):
        started = time.perf_counter()
        if i % 2:
            cost.add_rpc("Lookup", started)
        else:
            cost.add_cache("get_many", started)
    assert len(cost.calls) == costs.MOST_CALLS and cost.datastore.total() + cost.cache.total() == costs.MOST_CALLS + 5
    assert costs.timeline(cost.kept_calls(), costs.MOST_CALLS + 5)["cut"] == 5
    assert all(0 <= call.start_ms <= call.end_ms for call in cost.calls)
    assert [call.start_ms for call in cost.calls] == sorted(call.start_ms for call in cost.calls)
    assert {call.kind for call in cost.calls} == {"datastore", "cache"}


def test_a_cost_ends_under_its_lock():
    """`end` changes the Cost under its lock, as every change does: an RPC answered on a gRPC thread reads `ended`
    (whether to keep the call for the timeline) under that lock, while the response is being made."""
    cost, ended = Cost(), threading.Event()
    with cost.lock:  # as an RPC's answer being counted holds it
        ender = threading.Thread(target=lambda: (cost.end(), ended.set()))
        ender.start()
        assert not ended.wait(0.3) and cost.ended is None  # it waits for the lock
    assert ended.wait(5) and cost.ended is not None
    ender.join()


def test_accounting_off_counts_nothing(stack):
    """bench/overhead.py's second app, which measures what the counting itself costs, counts and records nothing; the
    first counts as every app does."""
    counted, off = overhead.on_and_off(settings_for(stack, **stack.fresh()))
    runtime.of(counted).close()
    with running(off, flush=True) as app:
        r = app.test_client().get("/api/counters", headers={"Host": overhead.OFF_HOST})
        assert r.status_code == 200 and "Server-Timing" not in r.headers
        assert runtime.of(app).cache.get(captures.NEXT) is None  # nothing recorded
    assert runtime.of(counted).counting_costs is True


# --- a request's timeline (/appstats/<id>) ---------------------------------------------------------------------------

def _recorded(client, path):
    """The record /api/appstats keeps of the last request to `path`."""
    return next(r for r in client.get("/api/appstats").get_json()["requests"] if r["path"] == path)


def test_a_requests_timeline_draws_every_call_it_counted(client, auth):
    """The calls drawn are the calls counted: as many bars as its Server-Timing said RPCs and cache calls, each a
    span within the request, and a critical path of calls that each began after the one before it was answered."""
    auth.admin()
    client.put("/api/counters/drawn", json={"mode": "general", "num_shards": 4})
    runtime.of(client.application).cache.flush()
    r = client.get("/counters")
    said = timing(r)
    record = _recorded(client, "/counters")
    found = client.get(f"/api/appstats/{record['id']}").get_json()
    calls = found["calls"]
    assert found["request"] == record and found["cut"] == 0
    counted = record["datastore"]["rpcs"] + record["cache"]["calls"]
    assert len(calls) == said["datastore"][0] + said["cache"][0] == counted
    assert {c["name"] for c in calls if c["kind"] == "datastore"} == set(record["datastore"]["by_method"])
    assert all(0 <= c["start_ms"] <= c["end_ms"] <= record["app_ms"] for c in calls)
    critical = [c for c in calls if c["critical"]]
    assert critical and all(a["end_ms"] <= b["start_ms"] for a, b in zip(critical, critical[1:], strict=False))
    page = client.get(f"/appstats/{record['id']}").get_data(as_text=True)
    assert page.count("data-bar") == len(calls) and page.count("data-critical") == len(critical)
    assert 'role="img"' in page and "Timeline of request" in page
    listing = client.get("/appstats").get_data(as_text=True)
    assert f'href="/appstats/{record["id"]}"' in listing


def _two_lookups(app):
    """`app` with a route that reads ten entities by key, twice, one read after the other, past every cache; the
    timeline's JSON and page of a request to it, served by an admin."""
    @app.get("/two-lookups")
    def two_lookups():
        keys = [ndb.Key("Tally", f"k{i}") for i in range(10)]
        for _ in range(2):
            ndb.get_multi(keys, use_cache=False, use_global_cache=False)
        return "ok"

    def timeline_of_a_request():
        client = app.test_client()
        Auth(client).admin()
        assert client.get("/two-lookups").status_code == 200
        record = _recorded(client, "/two-lookups")
        return (client.get(f"/api/appstats/{record['id']}").get_json(),
                client.get(f"/appstats/{record['id']}").get_data(as_text=True))
    return timeline_of_a_request


def test_a_timeline_shows_each_calls_production_wait_and_this_machines_time_apart(app, stack):
    """Under LATENCY=production, through the stand-in, each Datastore call of a request carries the wait the stand-in
    reported for it (wait_ms) and this machine's own time apart (machine_ms), the two making up its bar; the page's
    table has a column for each. Bare (no profile), every call's wait is 0 and its table has neither column. (A
    Lookup waits 30 ms more a key here, production's 0.5: its wait is surely most of its time, however busy the
    machine.)"""
    with StandIn(stack.emulator, "production", knobs={"LOOKUP_MS_PER_KEY": 30.0}) as standin, \
            running(make_app(stack, LATENCY="production", DATASTORE_EMULATOR_HOST=standin.host,
                             **stack.fresh())) as modelled:
        timeline_of_a_request = _two_lookups(modelled)
        timeline_of_a_request()  # the channel connected and the emulator warm before anything is read
        found, page = timeline_of_a_request()
    lookups = [c for c in found["calls"] if c["kind"] == "datastore"]
    assert [c["name"] for c in lookups] == ["Lookup", "Lookup"], found
    for call in lookups:  # 9 keys after the first: 270 ms, less the emulator's own time for them
        assert call["wait_ms"] > 100 and 0 <= call["machine_ms"] < call["wait_ms"], call
        assert call["machine_ms"] == pytest.approx(call["end_ms"] - call["start_ms"] - call["wait_ms"], abs=0.01)
    assert page.count("data-wait>") == page.count("data-machine>") == len(found["calls"])
    assert "production's wait (ms)" in page and "this machine's (ms)" in page
    assert (f"{lookups[0]['wait_ms']:.2f} production&#39;s wait, {lookups[0]['machine_ms']:.2f} this machine&#39;s"
            in page)  # each bar's title and the table's detail

    found, page = _two_lookups(app)()
    assert [c["name"] for c in found["calls"] if c["kind"] == "datastore"] == ["Lookup", "Lookup"], found
    assert all(c["wait_ms"] == 0 for c in found["calls"])
    assert all(c["machine_ms"] == pytest.approx(c["end_ms"] - c["start_ms"], abs=0.01) for c in found["calls"])
    assert "data-wait" not in page and "production&#39;s wait" not in page and "production's wait (ms)" not in page


def test_only_admins_see_a_timeline_and_only_while_it_is_kept(client, auth):
    client.get("/healthz")
    assert client.get("/appstats/1").status_code == 401 and client.get("/api/appstats/1").status_code == 401
    auth.sign_in()
    assert client.get("/appstats/1").status_code == 403 and client.get("/api/appstats/1").status_code == 403
    auth.admin()
    newest = client.get("/api/appstats").get_json()["requests"][0]["id"]
    # ids start from the clock in microseconds: none has been given above the counter, nor at or below its first start
    for never in (newest + 10 ** 6, 1, captures.FIRST_START):
        assert client.get(f"/api/appstats/{never}").get_json()["error"]["code"] == "no_such_request", never
        assert client.get(f"/appstats/{never}").status_code == 404
    for bad in ("/appstats/0x1", "/appstats/-1", "/api/appstats/x"):
        assert client.get(bad).status_code == 404


def test_a_timeline_keeps_its_first_calls_and_says_how_many_more(client, auth):
    """A request with more calls than MOST_CALLS keeps the first ones for its timeline, counts them all, and its
    page says how many were not drawn."""
    app = client.application

    @app.get("/many-calls")
    def many_calls():
        cache = runtime.current().cache
        for i in range(costs.MOST_CALLS + 7):
            cache.get(f"many-{i}")
        return "ok"

    auth.admin()
    assert timing(client.get("/many-calls"))["cache"][0] == costs.MOST_CALLS + 7
    record = _recorded(client, "/many-calls")
    found = client.get(f"/api/appstats/{record['id']}").get_json()
    assert len(found["calls"]) == costs.MOST_CALLS and found["cut"] == 7
    page = client.get(f"/appstats/{record['id']}").get_data(as_text=True)
    assert "data-cut" in page and "7 more calls" in page and page.count("data-bar") == costs.MOST_CALLS


def test_a_timeline_shows_a_hostile_path_as_text(client, auth):
    """The path is the client's: drawn into the page's SVG and table, it is escaped like any text."""
    auth.admin()
    client.get("/x%3Cscript%3Ealert(1)%3C/script%3E%22%3E%3Csvg%20onload=alert(2)%3E")
    record = next(r for r in client.get("/api/appstats").get_json()["requests"] if r["path"].startswith("/x<"))
    page = client.get(f"/appstats/{record['id']}").get_data(as_text=True)
    assert "<script>alert(1)" not in page and "<svg onload" not in page and "&lt;script&gt;alert(1)" in page


def test_the_request_lines_go_to_stderr_locally_and_stdout_on_app_engine():
    """Each logger writes its lines, whole, to its own stream: Cloud Logging reads App Engine's stdout."""
    script = ("from appstats import accounting\n"
              "accounting.LOCAL_LINES.info('GET /local 200')\n"
              "accounting.CLOUD_LINES.info('{\"severity\": \"INFO\"}')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stderr == "GET /local 200\n" and done.stdout == '{"severity": "INFO"}\n'


def test_the_critical_path_is_the_longest_chain_of_calls_one_after_another():
    """A staircase is all on it; of calls in flight together, one; the chain with the most time wins."""
    def calls(*spans):
        return [costs.TimedTrip("datastore", f"c{i}", a, b) for i, (a, b) in enumerate(spans)]
    assert costs.critical_path(calls((0, 1), (1, 2), (2, 5))) == {0, 1, 2}
    assert costs.critical_path(calls((0, 4), (0, 1), (1, 2), (4, 5))) == {0, 3}  # 4 ms + 1 ms beats 1 + 1 + 1
    assert len(costs.critical_path(calls((0, 3), (0, 3), (0, 3)))) == 1
    assert costs.critical_path([]) == set()


# --- the captures, shared by every process (appstats/captures.py) -----------------------------------------------------

def test_a_record_no_longer_in_the_cache_says_it_expired(client, auth):
    """A record the cache evicted (or let expire) is a 404 that says so, on the page and in the API, and is no longer
    listed; after a flush the ids go on from the time, so an old link never opens a newer request."""
    auth.admin()
    client.get("/api/counters/evicted")
    record = _recorded(client, "/api/counters/evicted")
    assert client.get(f"/api/appstats/{record['id']}").status_code == 200
    cache = runtime.of(client.application).cache
    assert cache.delete(f"appstats:slot:{record['id'] % captures.RING}")  # what an eviction or an expiry does
    api = client.get(f"/api/appstats/{record['id']}")
    assert api.status_code == 404 and api.get_json()["error"]["code"] == "request_expired"
    said = api.get_json()["error"]["message"]
    assert "no longer kept" in said
    # what it keeps, as it keeps it: one ring for all processes, of which the listing shows the newest
    assert f"the last {captures.RING:,} requests of all processes together" in said
    assert f"it lists the newest {captures.LISTED}" in said
    page = client.get(f"/appstats/{record['id']}")
    assert page.status_code == 404 and "no longer kept" in page.get_data(as_text=True)
    assert record["id"] not in {r["id"] for r in client.get("/api/appstats").get_json()["requests"]}
    # flushed: the counter and every record gone; the next ids are larger than any before, so the old one stays gone
    client.get("/api/counters/before-flush")
    old = _recorded(client, "/api/counters/before-flush")
    cache.flush()
    # asked before any request numbered since: the counter is gone with the records, and the id is still one given
    flushed = client.get(f"/api/appstats/{old['id']}")
    assert flushed.status_code == 404 and flushed.get_json()["error"]["code"] == "request_expired"
    cache.flush()  # (that request was numbered: the counter is back)
    ahead = time.time_ns() // 1000 + 10 ** 9  # while the counter is missing, the clock bounds the ids given
    assert client.get(f"/api/appstats/{ahead}").get_json()["error"]["code"] == "no_such_request"
    client.get("/api/counters/after-flush")
    new = _recorded(client, "/api/counters/after-flush")
    assert new["id"] > old["id"]
    assert client.get(f"/api/appstats/{old['id']}").get_json()["error"]["code"] == "request_expired"


def test_with_the_cache_away_requests_are_served_and_appstats_says_why_it_has_nothing(client, auth, stack):
    """The records live in the cache: frozen (SIGSTOP: every call times out), every request is still served, no record
    kept, and /appstats and its API say the cache is away (503, not an empty list, a 404 or a 500); keeping a record
    costs one timeout, not three. Frozen rather than stopped: a stopped server's port could be taken meanwhile by
    another test run on this machine."""
    from core import cache as cache_module
    auth.admin()
    client.get("/healthz")
    kept = client.get("/api/appstats").get_json()["requests"][0]
    cache = runtime.of(client.application).cache
    stack.cache.pause()
    try:
        assert client.get("/api/counters").status_code == 200
        listing = client.get("/api/appstats")
        assert listing.status_code == 503 and listing.get_json()["error"]["code"] == "cache_away"
        assert client.get(f"/api/appstats/{kept['id']}").get_json()["error"]["code"] == "cache_away"
        page = client.get("/appstats")
        assert page.status_code == 503 and "data-cache-away" in page.get_data(as_text=True)
        started = time.monotonic()
        with runtime.of(client.application).activated():
            assert captures.keep(cache, kept, []) is None
        elapsed = time.monotonic() - started
    finally:
        stack.cache.resume()
    assert elapsed < cache_module.IO_TIMEOUT + cache_module.CONNECT_TIMEOUT + 0.2, elapsed
    client.get("/api/counters/back")
    assert client.get("/api/appstats").get_json()["requests"][0]["path"] == "/api/counters/back"  # kept again


def test_a_visitor_is_told_how_to_sign_in_and_comes_back(client, auth):
    """/appstats for a visitor: a 401 with a link to the sign-in that comes back to /appstats; signed in without
    admin, a 403 that says so."""
    page = client.get("/appstats")
    html = page.get_data(as_text=True)
    assert page.status_code == 401 and 'href="/signin?next=/appstats" data-signin' in html, html
    signin = client.get("/signin?next=%2Fappstats").get_data(as_text=True)
    assert 'name="next" value="/appstats"' in signin
    auth.sign_in()
    page = client.get("/appstats")
    assert page.status_code == 403 and "not as an admin" in page.get_data(as_text=True)


def test_static_files_are_not_recorded(client, auth):
    auth.admin()
    assert client.get("/static/css/app.css").status_code == 200
    client.get("/healthz")
    assert not [r for r in client.get("/api/appstats").get_json()["requests"] if r["path"].startswith("/static/")]


def test_a_burst_counts_the_work_of_its_threads(client, auth):
    """The 200 increments of a burst run on 16 threads: their RPCs, cache calls and bill are the request's, in its
    Server-Timing, its record and its timeline (its first MOST_CALLS calls drawn, the others counted in `cut`)."""
    auth.admin()
    client.put("/api/counters/threads", json={"mode": "general", "num_shards": 4})
    r = client.post("/api/counters/threads/burst", json={"writers": 16, "increments": 200})
    assert r.status_code == 200 and r.get_json()["increments"] == 200
    said = timing(r)
    assert said["datastore"][1]["Commit"] >= 200, r.headers["Server-Timing"]
    record = _recorded(client, "/api/counters/threads/burst")
    assert record["datastore"]["by_method"]["Commit"] >= 200 and record["billed"]["writes"] >= 200
    assert record["datastore"]["rpcs"] == said["datastore"][0]
    found = client.get(f"/api/appstats/{record['id']}").get_json()
    assert len(found["calls"]) == costs.MOST_CALLS
    assert found["cut"] == record["datastore"]["rpcs"] + record["cache"]["calls"] - costs.MOST_CALLS
    # the form's burst too (POST /counters/burst-new): its answer says its 200 increments' commits
    r = client.post("/counters/burst-new", data={"csrf_token": csrf_token(client)})
    assert r.status_code == 302 and timing(r)["datastore"][1]["Commit"] >= 200, r.headers["Server-Timing"]


def test_threads_a_request_starts_count_in_its_cost_and_no_change_is_lost(app):
    """Runtime.map_in_threads hands the request's Cost to its threads; 16 threads counting at once lose no call."""
    rt = runtime.of(app)
    with costs.measured() as cost, rt.context():
        rt.map_in_threads(lambda _: [rt.cache.get(f"t-{i}") for i in range(50)], range(16))
    assert cost.cache["get"] == 16 * 50
    with costs.measured() as outside:
        pass
    assert outside.cache.total() == 0


def test_two_processes_every_link_opens_its_own_request(stack):
    """Two gunicorn servers on one cache, standing in for two App Engine instances (or two workers): the rows of
    requests sent to each by turns are listed together, with ids no two share, and each row's link, opened 20 times,
    10 on each process, opens the request it names, page and API alike. With a store per process the same id named
    two requests and half the links were a 404. Two servers, not one of two workers: which worker accepts a
    connection is the kernel's choice, so a test of two workers may see only one."""
    namespace = f"a{uuid.uuid4().hex[:12]}"
    env = dict(app_env(stack, SECRET, admins=ADMIN), DATASTORE_NAMESPACE=namespace)
    with instances(env, 2, workers=1, threads=4) as servers:
        admins = [signed_in(server.url, ADMIN, admin=True) for server in servers]
        for i in range(20):
            assert admins[i % 2].get(f"{servers[i % 2].url}/api/counters/row-{i}", timeout=30).status_code == 404
        page = admins[0].get(f"{servers[0].url}/appstats", timeout=30).text
        links = dict(re.findall(r'href="/appstats/(\d+)" data-timeline-link><code>GET (/api/counters/row-\d+)</code>',
                                page))
        assert sorted(links.values()) == sorted(f"/api/counters/row-{i}" for i in range(20)), page[:2000]
        listed = admins[1].get(f"{servers[1].url}/api/appstats", timeout=30).json()["requests"]
        rows = {r["path"]: r for r in listed if r["path"].startswith("/api/counters/row-")}
        assert {str(r["id"]): path for path, r in rows.items()} == links
        assert len({r["process"] for r in rows.values()}) == 2, "every row served by one process"
        for turn in range(20):
            admin, url = admins[turn % 2], servers[turn % 2].url
            for request_id, path in links.items():
                opened = _answered(admin, f"{url}/appstats/{request_id}")
                assert opened.status_code == 200 and f"<code>GET {path}</code>" in opened.text, (request_id, path)
                assert _answered(admin, f"{url}/api/appstats/{request_id}").json()["request"] == rows[path]


def _answered(session, url):
    """GET `url`, sent again (at most twice) while it answers 503 cache_away: on this shared machine a cache call can
    outlast its 0.25 s timeout, and the app rightly says so rather than taking it for a record that is gone."""
    for _ in range(3):
        answer = session.get(url, timeout=30)
        if answer.status_code != 503:
            return answer
        assert "cache_away" in answer.text or "cache is not answering" in answer.text, answer.text
    return answer


def test_admins_find_appstats_in_the_header(client, auth):
    """The header's navigation links /appstats for admins (marked as the page they are on there), for no one else."""
    def nav(path):
        return re.search(r'<nav aria-label="Main">(.*?)</nav>', client.get(path).get_data(as_text=True), re.S)[1]
    assert 'href="/appstats"' not in nav("/counters")
    auth.sign_in()
    assert 'href="/appstats"' not in nav("/counters")
    auth.admin()
    assert '<a href="/appstats">Appstats</a>' in nav("/counters")
    assert '<a href="/appstats" aria-current="page">Appstats</a>' in nav("/appstats")


def test_the_timeline_legend_shows_the_colours_of_the_bars(client, auth):
    """Every call of a staircase is on the critical path: its bars keep their kind's colour (the critical ones are
    outlined, no fill of their own), so the legend's colours are the bars' in every case, and a call of microseconds
    is drawn wide enough for its colour to show inside the outline; the last tick is anchored at its end, inside the
    figure."""
    app = client.application

    @app.get("/staircase")
    def staircase():
        cache = runtime.current().cache
        for i in range(3):
            cache.get(f"stair-{i}")
        time.sleep(0.2)  # work of its own after them: to scale, each call is a sliver of the request's time
        return "ok"

    auth.admin()
    client.get("/staircase")
    record = _recorded(client, "/staircase")
    page = client.get(f"/appstats/{record['id']}").get_data(as_text=True)
    bars = re.findall(r'<rect [^>]*class="([^"]+)"[^>]*data-bar', page)
    assert bars == ["tl-cache tl-critical"] * 3, bars  # all critical, each still a cache call's colour
    legend = re.search(r"<figcaption data-legend>(.*?)</figcaption>", page, re.S)[1]
    assert 'class="tl-key tl-cache"' in legend and "cache call" in legend and "critical path" in legend
    ticks = re.findall(r'class="(tl-tick[^"]*)"', page)
    assert ticks[-1] == "tl-tick tl-tick-end" and all(t == "tl-tick" for t in ticks[:-1])
    css = (Path(__file__).resolve().parents[1] / "static/css/app.css").read_text()
    critical = re.search(r"\.tl-critical \{([^}]*)\}", css)[1]
    assert "fill" not in critical and "stroke" in critical
    outline = float(re.search(r"stroke-width: ([\d.]+)", critical)[1])  # half of it inside each edge of a bar
    widths = [float(w) for w in re.findall(r'<rect [^>]*width="([\d.]+)"[^>]*data-bar', page)]
    assert len(widths) == 3 and min(widths) - outline >= 5, widths  # 1.5 wide, the cache calls showed black
    assert "text-anchor: end" in re.search(r"\.tl-tick-end \{([^}]*)\}", css)[1]
