"""RPC budgets and billed budgets: each page's and each API read's Datastore RPCs, by method, on a warm cache, with
the demo content `make run` seeds. Read from the request's own Server-Timing header (core/costs.py), so a change
that makes a page read Datastore again where the cache should serve it, or read the same thing twice, fails here, not
only in a benchmark. The cached front page and the feed read nothing from Datastore at all.

Beside the RPCs, what production would bill each of them (core/billing.py, from the Server-Timing `billed` metric):
an RPC count says how often a page waits on Datastore, the bill what a million views of it cost, and a page can keep
its RPCs and still read 100 entities more. The bills are the same on both backends: they count entities, not time.
"""
import pytest

from core import runtime
from counters import demo as counters_demo
from counters import growth as counter_growth
from main import seed_demo
from tests.support import billed, make_app, running, timing

SHARD_VIEW = f"/api/counters/{counters_demo.TOUR_COUNTER}?shards=1"
SIMPLE_SHARDS = "/api/simple-counter?shards=1"
# path -> Datastore RPCs by method on a warm cache, a visitor's (an admin's where ADMIN_BUDGETS says otherwise)
BUDGETS = {
    "/": {"RunQuery": 1},  # the last job, for the mapper's card; every other figure from the cache
    "/counters": {"RunQuery": 1},  # the counters' configs; every shard from its copy seconds old
    "/blog": {"RunQuery": 1},
    "/blog/demo": {},
    "/blog/demo/feed.atom": {},
    "/blog/demo/59": {"RunQuery": 1},  # the page of comments; the entry and its counts from the cache
    "/jobs": {"RunQuery": 1},
    "/accounts": {"Lookup": 1},  # the audit by key; the kept figures from their copy seconds old
    "/numbers": {"Lookup": 1},
    "/healthz": {"Lookup": 1},  # proves Datastore answers, bypassing the caches on purpose
    "/api/counters": {"RunQuery": 1},
    SHARD_VIEW: {},  # a visitor's shard view from its cached copy (counters.totals.cached_totals)
    "/api/simple-counter": {},  # its total kept in the cache (counters/simple.py)
    SIMPLE_SHARDS: {},  # its shards from their copy seconds old (counters.totals.simple_shard_counts)
    "/api/blogs": {"RunQuery": 1},
    "/api/blogs/demo/entries": {},
    "/api/blogs/demo/entries/59": {},
    "/api/blogs/demo/entries/59/comments": {"RunQuery": 1},
    "/api/jobs": {"RunQuery": 1},
    "/api/accounts/summary": {},
    "/api/accounts/audit": {"Lookup": 1},
    "/api/numbers": {"Lookup": 1},
    "/api/session": {},
    "/source/counters/service.py": {},
    "/signin": {},
}
# An admin reads the shards themselves, where anyone else gets a copy a few seconds old (identity.reads_exactly;
# tests/test_costly_reads.py): the counters page's in one batch, the kept figures' configs and then their shards, with
# the audit by key in the first batch.
ADMIN_BUDGETS = {SHARD_VIEW: {"Lookup": 1}, SIMPLE_SHARDS: {"Lookup": 1}, "/counters": {"RunQuery": 1, "Lookup": 1},
                 "/accounts": {"Lookup": 2}, "/api/accounts/summary": {"Lookup": 1}}

# path -> billed (reads, writes, deletes) on a warm cache, for a visitor and an admin; GETs never write. A query that
# returns nothing bills nothing ("/", "/jobs": no job yet). For an admin the counters page reads every shard
# of every counter it shows in its one Lookup: 3 configs, 20 + 8 shards of the general counters, the simple counter's
# 20, and as many as the adaptive counter has grown to (1 to 256, with the seeding's contention): 179 to 307 reads, the
# dearest page here (a million views: $54 to $92). A visitor's view reads every shard from its cached copy, the simple
# counter's too: 3 configs (it had read 179 to 307 too, as often as anyone loaded it, and then 23 until issue 75).
COUNTERS_PAGE_FIXED_READS = 3 + 20 + 8 + 20
COUNTERS_PAGE_VISITOR_READS = 3
BILLS = dict.fromkeys(BUDGETS, (0, 0, 0)) | {
    "/blog": (1, 0, 0),
    "/blog/demo/59": (21, 0, 0),  # a page of 20 comments, and the read of the next page's first (has-more)
    "/accounts": (1, 0, 0),  # the audit; the kept figures from their copy (an admin: their configs and 32 shards)
    "/numbers": (1, 0, 0),
    "/healthz": (1, 0, 0),
    "/api/counters": (3, 0, 0),
    "/api/blogs": (1, 0, 0),
    "/api/blogs/demo/entries/59/comments": (21, 0, 0),
    "/api/accounts/audit": (1, 0, 0),
    "/api/numbers": (1, 0, 0),
}


@pytest.fixture(scope="module")
def seeded(stack):
    with running(make_app(stack, checked=False, **stack.fresh()), flush=True) as app:
        seed_demo(app)
        yield app


@pytest.mark.parametrize("admin", [False, True], ids=["visitor", "admin"])
def test_each_page_and_api_read_keeps_its_datastore_budget(seeded, admin):
    client = seeded.test_client()
    if admin:
        client.post("/api/session", json={"email": "boss@example.com", "admin": True})
    spent, bills = {}, {}
    with runtime.of(seeded).context():
        grown = counter_growth.get_config(counters_demo.TOUR_COUNTER).num_shards
    budgets = BUDGETS | (ADMIN_BUDGETS if admin else {})
    if admin:
        budgeted = BILLS | {"/counters": (COUNTERS_PAGE_FIXED_READS + grown, 0, 0), SHARD_VIEW: (grown, 0, 0),
                            SIMPLE_SHARDS: (20, 0, 0), "/accounts": (33, 0, 0), "/api/accounts/summary": (32, 0, 0)}
    else:
        budgeted = BILLS | {"/counters": (COUNTERS_PAGE_VISITOR_READS, 0, 0)}
    for path in budgets:
        for _ in range(2):  # warm: the first reads fill the caches
            client.get(path)
        response = client.get(path)
        assert response.status_code in (200, 401), (path, response.status_code)
        spent[path] = timing(response)["datastore"][1]
        bills[path] = billed(response)[:3]
    over = {path: (spent[path], budget) for path, budget in budgets.items() if spent[path] != budget}
    assert not over, f"Datastore RPCs (spent, budget) that moved: {over}"
    moved = {path: (bills[path], bill) for path, bill in budgeted.items() if bills[path] != bill}
    assert not moved, f"Billed (reads, writes, deletes) as (spent, budget) that moved: {moved}"


def test_the_cached_front_page_reads_nothing_from_datastore_but_reads_it_all_without_its_cache(seeded):
    client = seeded.test_client()
    client.get("/blog/demo")
    assert timing(client.get("/blog/demo"))["datastore"][0] == 0
    client.post("/api/session", json={"email": "boss@example.com", "admin": True})
    bypassed = timing(client.get("/blog/demo?cache=bypass"))["datastore"]
    # the BlogIndex, the page's query, and every entry's counts from their counters' configs and shards
    assert bypassed[1].get("RunQuery") == 1 and bypassed[1].get("Lookup", 0) >= 2, bypassed


def test_a_page_deep_in_the_blog_bills_what_a_page_near_its_top_bills(seeded):
    """Pages at the same cost at any depth: a page of 10 found by index bills its 10 entries and the one after them
    (where the next page starts), at start 58 as at start 1. By offset, the page at start 1 would bill the 57
    entries above it as well."""
    client = seeded.test_client()
    bills = {}
    for start in (58, 30, 10, 1):
        path = f"/api/blogs/demo/entries?start={start}&limit=10"
        client.get(path)  # warm: the BlogIndex from ndb's global cache, the entries' counts from memcache
        bills[start] = billed(client.get(path))[:3]
    assert bills == {58: (11, 0, 0), 30: (11, 0, 0), 10: (11, 0, 0), 1: (2, 0, 0)}, bills


def test_an_anonymous_visitor_makes_the_app_read_a_counters_shards_once_not_on_every_view(seeded):
    """Anyone may load the shard view of the demo counter (its 128 or so shards) as often as they like: the second
    anonymous view within SHARD_VIEW_LIFETIME is served from the cached copy and bills no read, and the counters page
    bills only its configs' query. An admin still reads every shard."""
    client = seeded.test_client()
    with runtime.of(seeded).context():
        grown = counter_growth.get_config(counters_demo.TOUR_COUNTER).num_shards
    path = SHARD_VIEW
    first, second = client.get(path), client.get(path)
    assert first.status_code == second.status_code == 200
    assert second.get_json()["shards"] == first.get_json()["shards"] and len(first.get_json()["shards"]) == grown
    assert billed(second)[:3] == (0, 0, 0), billed(second)
    client.get("/counters")
    assert billed(client.get("/counters"))[:3] == (COUNTERS_PAGE_VISITOR_READS, 0, 0)
    client.post("/api/session", json={"email": "boss@example.com", "admin": True})
    assert billed(client.get(path))[:3] == (grown, 0, 0)
    assert billed(client.get("/counters"))[:3] == (COUNTERS_PAGE_FIXED_READS + grown, 0, 0)
