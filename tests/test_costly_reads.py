"""Reads anyone can ask for that would read hundreds of entities (issue 57, item 2): a job's timeline (a record per
task), a counter's shards (one entity each, up to 256). Each is served from the cache on a repeat, whoever asks but an
admin for the shards, so no visitor or ordinary signed-in person can make every request read them again. Counted by
the request's own Server-Timing header (core/costs.py), as tests/test_budgets.py pins RPC budgets."""
import time

from accounts import service as accounts_service
from counters import totals as counters_totals
from mapper import views as mapper_views
from tests.support import billed, timing
from tests.test_api_jobs import _credited


def _rpcs(response):
    return timing(response)["datastore"][0]


def test_a_finished_jobs_timeline_is_read_once_then_served_to_anyone_from_the_cache(client, auth, task_queue):
    """The issue's probe: an anonymous GET of a finished many-task job's timeline read every task's record on every
    call. Now the first call reads them, and every later one, the API's and the page's, reads nothing."""
    auth.admin()
    job_id = _credited(client, task_queue, 200, page_size=10, fanout=4)
    auth.sign_out()
    first = client.get(f"/api/jobs/{job_id}/timeline")
    tasks = first.get_json()["job"]["tasks"]
    assert first.status_code == 200 and first.get_json()["job"]["state"] == "done" and tasks > 5
    assert billed(first)[0] >= tasks, first.headers["Server-Timing"]  # every record drawn, once
    for _ in range(3):
        again = client.get(f"/api/jobs/{job_id}/timeline")
        assert again.get_json() == first.get_json() and _rpcs(again) == 0 and billed(again)[0] == 0
    page = client.get(f"/jobs/{job_id}/timeline")
    assert page.status_code == 200 and _rpcs(page) == 0 and page.get_data(as_text=True).count("data-bar") == tasks
    auth.sign_in()  # an ordinary signed-in person: the same copy
    assert _rpcs(client.get(f"/api/jobs/{job_id}/timeline")) == 0
    # a malformed or unknown id is still refused, and nothing is cached for it
    assert client.get("/api/jobs/nope/timeline").status_code == 400
    for _ in range(2):
        assert client.get("/api/jobs/0123456789abcdef/timeline").status_code == 404


def test_a_running_jobs_timeline_is_cached_for_seconds_and_then_shows_the_job_finished(client, auth, task_queue,
                                                                                       monkeypatch):
    monkeypatch.setattr(mapper_views, "TIMELINE_RUNNING_LIFETIME", 1)
    auth.admin()
    client.post("/api/accounts/seed", json={"count": 40})
    task_queue.drain()
    job_id = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 1},
                                            "page_size": 10}).get_json()["id"]
    running = client.get(f"/api/jobs/{job_id}/timeline")
    assert running.get_json()["job"]["state"] == "running" and _rpcs(running) >= 1
    repeat = client.get(f"/api/jobs/{job_id}/timeline")
    assert _rpcs(repeat) == 0 and repeat.get_json() == running.get_json()
    task_queue.drain(workers=2)
    # still the running copy until it expires, then the finished job, read once and kept
    deadline = time.monotonic() + 10
    while client.get(f"/api/jobs/{job_id}/timeline").get_json()["job"]["state"] == "running":
        assert time.monotonic() < deadline, "the running copy outlived its lifetime"
        time.sleep(0.2)
    done = client.get(f"/api/jobs/{job_id}/timeline")
    assert done.get_json()["job"]["state"] == "done" and _rpcs(done) == 0
    assert sum(t["processed"] for t in done.get_json()["tasks"]) == 40


def test_only_an_admin_reads_a_counters_shards_every_time(client, auth):
    """The issue's probe: signed in (in production: anyone with a Google account), `GET /api/counters/likes?shards=1`
    and `GET /counters` read every shard on every call. Now an ordinary signed-in person gets the cached copy a
    visitor gets (SHARD_VIEW_LIFETIME seconds old at most); only an admin reads the shards themselves."""
    auth.admin()
    client.put("/api/counters/likes", json={"mode": "general", "num_shards": 64})
    client.post("/api/counters/likes/increment")
    auth.sign_in("someone@example.com")
    first = client.get("/api/counters/likes?shards=1")
    assert sum(first.get_json()["shards"]) == 1 and billed(first)[0] >= 64
    for _ in range(3):
        again = client.get("/api/counters/likes?shards=1")
        assert again.get_json()["shards"] == first.get_json()["shards"] and billed(again)[0] == 0
        assert _rpcs(again) == 0
    client.get("/counters")
    page = client.get("/counters")
    # the configs' query only: none of the 64, nor the simple counter's 20 (from their copies)
    assert billed(page)[0] == 1, page.headers["Server-Timing"]
    auth.admin()
    exact = client.get("/api/counters/likes?shards=1")
    assert billed(exact)[0] >= 64 and billed(client.get("/api/counters/likes?shards=1"))[0] >= 64
    assert billed(client.get("/counters"))[0] >= 64 + 20


def test_ten_visitor_reads_in_a_row_of_the_simple_counters_shards_and_the_accounts_bill_only_the_first(
        client, auth, task_queue, monkeypatch):
    """Issue 75's probe: ten anonymous requests in a row, each billed: `/api/simple-counter?shards=1` 20 reads,
    `/counters` 20 more than its configs, `/api/accounts/summary` 32, `/accounts` 33. Now anyone but an admin gets
    copies seconds old (identity.reads_exactly; Cache.kept_copy): the first request in those seconds bills them, the
    next nine nothing of them; the copy is read again once it expires; an admin reads every time."""
    monkeypatch.setattr(counters_totals, "SHARD_VIEW_LIFETIME", 2)
    monkeypatch.setattr(accounts_service, "SUMMARY_LIFETIME", 2)
    auth.admin()
    assert client.post("/api/accounts/seed", json={"count": 3}).status_code == 202
    task_queue.drain()
    assert client.post("/api/simple-counter/increment").status_code == 200
    auth.sign_out()
    extra = {"/api/simple-counter?shards=1": 20, "/counters": 20, "/api/accounts/summary": 32, "/accounts": 32}
    for path, shards in extra.items():
        bills = [billed(client.get(path))[0] for _ in range(10)]
        if path.startswith("/api/"):  # the first of its copy's readers; the page after it shares the copy
            assert bills[0] >= shards and max(bills[1:]) == 0, (path, bills)
        else:
            assert max(bills) < shards, (path, bills)
    assert client.get("/api/accounts/summary").get_json() == {"count": 3, "total_balance": 0}
    shards = client.get("/api/simple-counter?shards=1").get_json()
    assert sum(shards["shards"]) == 1 and shards["count"] == 1
    assert client.post("/api/simple-counter/increment").status_code == 200  # anyone may add to the simple counter
    assert client.get("/api/simple-counter?shards=1").get_json()["count"] == 2  # the cached total has it at once
    time.sleep(2.5)
    assert sum(client.get("/api/simple-counter?shards=1").get_json()["shards"]) == 2  # the copy expired: read again
    auth.admin()
    for path, shards in extra.items():
        assert min(billed(client.get(path))[0] for _ in range(3)) >= shards, path
