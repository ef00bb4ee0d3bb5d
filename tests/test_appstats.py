"""Appstats (core/costs.py): every response says what it cost in its Server-Timing header, pages in their footer,
one log line per request (Cloud Logging's JSON on App Engine, with the trace id), and admins see the last requests."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appstats import accounting
from core import runtime
from devstack.apps import app_on
from devstack.taskqueue import DrainedQueue
from tests.support import ON_APP_ENGINE, make_app, running, timing


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


def test_the_recent_requests_are_bounded(client):
    store = client.application.extensions["appstats"]
    for _ in range(130):
        client.get("/healthz")
    assert len(store.items()) == 100


@pytest.fixture
def appstats_log(capsys):
    """The accounting's lines written since the last call, as written to stderr (locally) or stdout (on App Engine),
    where Cloud Logging reads them: one per request, whole, each a line of its own. Only the request lines: anything
    else written there (a warning) is not the accounting's. The lines wait a moment to be written in batches
    (accounting.LogLines): they are written first."""
    accounting.LOG.flush()
    capsys.readouterr()

    def lines():
        accounting.LOG.flush()
        out = capsys.readouterr()
        return [line for line in (out.err + out.out).split("\n")
                if re.match(r'(GET|POST|PUT|DELETE|HEAD) |\{"severity"', line)]
    return lines


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
    """The Server-Timing value joins the response's headers unchecked (appstats.accounting._bill), so its texts are
    checked when they are made (for cache calls, as the call is counted): a call's name with a line break in it is
    refused there, and a Datastore method's as well."""
    from core.costs import Cost
    with pytest.raises(ValueError, match="not a header value"):
        Cost().add_cache("get\r\nSet-Cookie: x=1", 0.001)
    cost = Cost()
    cost.add_rpc("Lookup\nX: 1", 0.001)
    with pytest.raises(ValueError, match="not a header value"):
        cost.now()


def test_cache_calls_find_their_mixs_texts_in_any_order_and_past_the_last_link(monkeypatch):
    """A request's cache calls find their mix as they come in (core.costs.CacheMix): the same calls in another order
    are the same mix; once a process has linked CacheMix.LINKS mixes, a mix is found by its counts, links no more, and
    says the same."""
    from core.costs import CacheMix, Cost

    def texts_of(calls):
        cost = Cost()
        for call in calls:
            cost.add_cache(call, 0.001)
        return cost.now()[0]
    first = texts_of(["get", "set", "get"])
    assert first is texts_of(["set", "get", "get"])
    assert (first.cache, first.cache_calls, first.datastore) == ((("get", 2), ("set", 1)), 3, ())
    assert 'cache;desc="3 calls: 2 get, 1 set"' in first.server_timing
    monkeypatch.setattr(CacheMix, "linked", CacheMix.LINKS)
    late = texts_of(["incr", "get", "incr", "delete-unlinked"])
    assert late.cache == (("delete-unlinked", 1), ("get", 1), ("incr", 2)) and CacheMix.linked == CacheMix.LINKS
    assert late is texts_of(["delete-unlinked", "incr", "incr", "get"])


def test_accounting_off_counts_nothing(stack):
    with running(make_app(stack, APPSTATS="off")) as app:
        r = app.test_client().get("/api/counters")
        assert r.status_code == 200 and "Server-Timing" not in r.headers
        assert app.extensions["appstats"].items() == []


def test_the_writer_writes_each_requests_line_by_itself_soon_after(client, capsys):
    """A request leaves its figures to the writer thread (accounting.Writer), which writes them within its interval,
    with nobody asking it to flush."""
    capsys.readouterr()
    client.get("/api/counters/writer-test")
    written = ""
    deadline = time.monotonic() + 10 * accounting.Writer.EVERY + 2
    while "GET /api/counters/writer-test 404" not in written and time.monotonic() < deadline:
        time.sleep(accounting.Writer.EVERY / 2)
        written += capsys.readouterr().err
    assert "GET /api/counters/writer-test 404" in written


def test_a_process_that_exits_writes_the_lines_still_waiting():
    """A process that exits (gunicorn's graceful stop, App Engine's shutdown) writes what the writer had not yet
    written: the line left just before exit is there, whole."""
    script = """
import time
from appstats import accounting
from core.costs import Cost
cost = Cost()
cost.add_cache("get_many", 0.0003)
texts, datastore_ms, cache_ms, _ = cost.now()
recent = accounting.RecentRequests(10, "memcached", None)
accounting.LOG.add(accounting.Served(recent, "GET", "/last", "", "200 OK", time.time(), 1.5, texts, datastore_ms,
                                     cache_ms, None))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert re.search(r"^GET /last 200 1\.5 ms \| datastore 0 RPCs 0\.0 ms \(none\) \| memcached 1 call 0\.3 ms "
                     r"\(1 get_many\) \| billed nothing \$0\.00/M$", done.stderr, re.M), done.stderr
