"""The README and docs/ hold together: every relative link (and image) names a file in the repo, and every #anchor
into a Markdown page names one of its headings, as GitHub renders them; and every figure they quote about the demo
(a page's bill, a footer, a Server-Timing header) is what a freshly seeded demo shows, so none can drift."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from accounts import service as accounts_service
from core import billing, runtime
from counters import demo as counters_demo
from counters import growth as counter_growth
from devstack.services import REPO
from main import seed_demo
from tests.support import billed, make_app, running

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _pages():
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    return [REPO / name for name in tracked if name == "README.md" or name.startswith("docs/")]


def _anchor(heading):
    """GitHub's anchor for a heading: lower case, code and link marks dropped, punctuation but - and _ removed,
    spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path):
    return {_anchor(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def test_every_link_in_the_readme_and_docs_leads_somewhere():
    pages = _pages()
    assert REPO / "README.md" in pages and len(pages) > 10
    broken = []
    for page in pages:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto: — outside the repo
                continue
            path, _, anchor = target.partition("#")
            found = (page.parent / path).resolve() if path else page
            if not found.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and found.suffix == ".md" and anchor not in _anchors(found):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_the_anchor_rule_is_githubs():
    assert _anchor("Lesson 1: sharded counters") == "lesson-1-sharded-counters"
    assert _anchor("Where production waits: `LATENCY=production`") == "where-production-waits-latencyproduction"
    assert _anchor("What a request costs: Appstats for today") == "what-a-request-costs-appstats-for-today"


# --- the demo's figures the README and docs quote, against a freshly seeded demo ------------------------------------

def _text(path):
    """A page's text with its line breaks and indents folded to single spaces, so a sentence reads as one line."""
    return re.sub(r"\s+", " ", (REPO / path).read_text())


def _quoted(path, pattern):
    found = re.search(pattern, _text(path))
    assert found, f"{path} no longer says: {pattern}"
    return found


@pytest.fixture(scope="module")
def fresh_demo(stack):
    """What a freshly seeded demo (`make run`'s `flask seed`) bills and says, each page on a warm cache (its third
    view), for a visitor and a signed-in admin: {"bills": {(who, path): reads}, "footers": ..., "timings": ...,
    "grown": the adaptive counter's shards}."""
    with running(make_app(stack, checked=False, **stack.fresh()), flush=True) as app:
        seed_demo(app)
        with runtime.of(app).context():
            grown = counter_growth.get_config(counters_demo.TOUR_COUNTER).num_shards
        seen = {"bills": {}, "footers": {}, "timings": {}, "grown": grown}
        for who in ("visitor", "admin"):
            client = app.test_client()
            if who == "admin":
                client.post("/api/session", json={"email": "boss@example.com", "admin": True})
            for path in ("/counters", "/accounts", "/api/accounts/summary", "/blog/demo", "/blog/demo?start=29",
                         "/blog/demo/59", f"/api/counters/{counters_demo.TOUR_COUNTER}?shards=1"):
                response = [client.get(path) for _ in range(3)][-1]
                assert response.status_code == 200, path
                seen["bills"][who, path] = billed(response)[0]
                seen["timings"][who, path] = response.headers["Server-Timing"]
                footer = re.search(r"data-cost>(.*?)</span>", response.get_data(as_text=True))
                seen["footers"][who, path] = footer and footer[1]
        yield seen


def _without_times(text):
    return re.sub(r"\d+\.\d+ ms|dur=[\d.]+", "", text)


def test_the_cost_examples_in_the_readme_and_docs_are_what_those_pages_say(fresh_demo):
    """The footer and Server-Timing examples are real pages' own, times aside (those are this machine's)."""
    cache = "redis" if os.environ.get("CACHE") == "redis" else "memcached"
    for path in ("README.md", "docs/lessons/costs.md"):
        footer = _quoted(path, r'cached front page\'?s?(?: \(`/blog/demo`\))?: "(this page: [^"]*)"')[1]
        assert _without_times(footer.replace("memcached", cache)) == \
            _without_times("this page: " + fresh_demo["footers"]["visitor", "/blog/demo"]), path
        header = _quoted(path, r"`(datastore;desc=[^`]*)`")[1]
        served = fresh_demo["timings"]["visitor", "/blog/demo?start=29"]
        if cache != "memcached":  # the examples are the default cache's: redis names its calls otherwise (mget)
            header, served = (re.sub(r'(cache;desc="\d+ calls?)[^"]*"', r'\1"', h) for h in (header, served))
        assert _without_times(header) == _without_times(served), path


def test_the_bills_the_readme_and_docs_quote_are_a_fresh_demos(fresh_demo):
    """Every figure of the demo's bill that the README and docs/ quote. The counters page's depends on how far the
    seeding's contention grew the adaptive counter, so the docs quote its fixed part and the reads per shard, and
    this checks both against the demo as it came out this time."""
    bills, grown = fresh_demo["bills"], fresh_demo["grown"]
    fixed = bills["admin", "/counters"] - grown  # the configs, the general counters' and the simple counter's shards
    visitor = bills["visitor", "/counters"]
    assert bills["admin", f"/api/counters/{counters_demo.TOUR_COUNTER}?shards=1"] == grown  # a read per shard

    readme = _quoted("README.md", r"bills an admin (\d+) reads and one more per shard of the demo's adaptive "
                     r"counter, which its seeding grows to between 1 and (\d+) shards as its writers collide \(up to "
                     r"(\d+) reads a view, \$([\d.]+) per million views\); a visitor's view, whose shards come from a "
                     r"copy a few seconds old, bills (\d+)")
    assert int(readme[1]) == fixed and int(readme[2]) == counter_growth.ADAPTIVE_MAX_SHARDS
    assert int(readme[3]) == fixed + counter_growth.ADAPTIVE_MAX_SHARDS and float(readme[4]) == _usd(int(readme[3]))
    assert int(readme[5]) == visitor

    costs = _quoted("docs/lessons/costs.md",
                    r"for an admin (\d+) reads a view and one per shard of the demo's "
                    r"adaptive counter: (\d+) at (\d+) shards \(\$([\d.]+) per million views; (\d+) at (\d+) shards;.*?"
                    r"A visitor's view, from the shards' copies a few seconds old, is (\d+)\. .*? A page of 20 "
                    r"comments "
                    r"is (\d+) reads .*? The front page at `\?start=29`, not cached, is (\d+) reads\. `/accounts` is "
                    r"(\d+) for an admin, and (\d+) \(its audit\) for anyone else")
    assert int(costs[1]) == fixed
    assert int(costs[2]) == fixed + int(costs[3]) and float(costs[4]) == _usd(int(costs[2]))
    assert int(costs[5]) == fixed + int(costs[6]) and int(costs[6]) == counter_growth.ADAPTIVE_MAX_SHARDS
    assert int(costs[7]) == visitor
    assert int(costs[8]) == bills["visitor", "/blog/demo/59"] == bills["admin", "/blog/demo/59"]
    assert int(costs[9]) == bills["visitor", "/blog/demo?start=29"]
    assert int(costs[10]) == bills["admin", "/accounts"] and int(costs[11]) == bills["visitor", "/accounts"]

    counters_doc = _quoted("docs/lessons/counters.md",
                           r"With the demo content that is (\d+) reads and one per shard of "
                           r"the adaptive counter, up to (\d+) reads per view.*?With the demo's adaptive counter at "
                           r"(\d+) shards, an uncached `GET /api/counters/likes\?shards=1` bills (\d+) reads\..*?"
                           r"`/counters` bills (\d+) \(its configs; the simple counter's 20 shards come from a "
                           r"copy too\) instead of (\d+) at (\d+) shards")
    assert int(counters_doc[1]) == fixed and int(counters_doc[2]) == fixed + counter_growth.ADAPTIVE_MAX_SHARDS
    assert int(counters_doc[3]) == int(counters_doc[4])  # a read per shard, as the demo's own shard view bills
    assert int(counters_doc[5]) == visitor and int(counters_doc[6]) == fixed + int(counters_doc[7])

    # The accounts' kept figures: two counters, each its config and KEPT_SHARDS shards, read by key.
    kept = 2 * (1 + accounts_service.KEPT_SHARDS)
    mapper_doc = _quoted("docs/lessons/mapper.md",
                         r"The page reads the kept figures' (\d+) entities by key at any size, "
                         r"(\d+) of them from Datastore \(the 2 configs come from ndb's global cache\)\. "
                         r"In production's "
                         r"bill the page is (\d+) reads at any size.*?In production's bill the kept figures are (\d+) "
                         r"reads at any size \(\$([\d.]+) per million\)")
    assert int(mapper_doc[1]) == kept and int(mapper_doc[2]) == kept - 2 == bills["admin", "/api/accounts/summary"]
    assert int(mapper_doc[3]) == bills["admin", "/accounts"]
    assert int(mapper_doc[4]) == bills["admin", "/api/accounts/summary"] and float(mapper_doc[5]) == _usd(kept - 2)
    page = (REPO / "templates/accounts/index.html").read_text()
    assert f"the kept figures are {kept} entities read by key" in re.sub(r"\s+", " ", page)


def _usd(reads):
    """Production's price of `reads` a million times, in dollars (core/billing.py's read price)."""
    return round(billing.Billed(reads=reads).usd_per_million(), 2)
