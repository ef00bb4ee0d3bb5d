"""The planner (planner/service.py, POST /api/plan, its forms on /numbers): each planner's arithmetic against sums done
by hand, bad input refused with nothing written, the page's forms and answers, and the planner's predictions against
the app's own benchmarks (bench/results/*.md), so that it cannot drift from what the app measures.

The arithmetic and the comparison tests use no fixture: they start no service. The API and page tests use the stack.
"""
import math
import re
from pathlib import Path

import pytest
import yaml
from google.cloud import ndb

from bench.harness import bill_cell
from core import billing, production_latency, runtime
from core.settings import WriteBudget
from core.tables import markdown_tables
from counters.growth import ContentionWindow
from counters.models import ADAPTIVE_MAX_SHARDS
from mapper.chunks import scan_limit
from planner import batch, blog, comments, counter, figures, request, service
from planner.figures import Rate
from tests.support import billed, csrf_token, timing
from tests.test_budgets import BUDGETS

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def answers(plan):
    return {a.name: a for a in plan.answers}


# --- the arithmetic, by hand -----------------------------------------------------------------------------------------

def test_counter_shards_and_costs_by_hand():
    plan = counter.plan_counter(Rate(50), 600, backend="firestore")
    got = answers(plan)
    assert got["shards"].value == 50  # 50 writes/s / 1 sustained write/s an entity
    assert got["increment_rpcs"].value == 1 and got["increment_ms"].value == 47.0  # one Commit, blind
    assert got["increment_usd_per_million"].value == 0.9  # 1 write: $0.09 per 100,000
    assert got["peak_usd"].value == round(0.9 * 50 * 600 / 1e6, 2)
    assert got["total_read"].value == 15.0  # 50 shard reads: 50 x $0.03 per 100,000 x 10
    legacy = answers(counter.plan_counter(Rate(50), 600, backend="legacy"))
    assert legacy["increment_rpcs"].value == 3 and legacy["increment_ms"].value == 76.0  # 14.5 + 14.5 + 47
    assert legacy["increment_usd_per_million"].value == 1.2
    assert legacy["model_per_shard"].value == round(1000 / 76, 1)
    # More shards than an adaptive counter may have: it never gets there, and the answer has no time to give
    beyond = answers(counter.plan_counter(Rate(1000), 60, backend="legacy"))["adaptive_seconds"]
    assert beyond.value is None and beyond.text.startswith("never")
    # Every figure says whose it is; the guidance and the prices carry a link.
    for figure in plan.figures:
        assert figure.whose in figures.WHOSE
        if figure.whose == "production":
            assert figure.source.startswith("https://cloud.google.com/")


def test_adaptive_growth_by_hand():
    # From 1 shard, a window of min(32, 8 x shards) attempts at each size: 8 + 16 + 32 + 32 + 32 + 32 = 152 to 64.
    assert ContentionWindow.WINDOW == 32 and ContentionWindow.ATTEMPTS_PER_SHARD == 8
    assert counter.adaptive_growth(50, 50) == (64, 6, 152 / 50)
    assert counter.adaptive_growth(1, 10) == (1, 0, 0.0)
    size, windows, _ = counter.adaptive_growth(10**6, 10)
    assert size == ADAPTIVE_MAX_SHARDS and windows == int(math.log2(ADAPTIVE_MAX_SHARDS))
    assert "never" in answers(counter.plan_counter(Rate(1000), 60))["adaptive_seconds"].text


def test_the_adaptive_counter_on_firestore_grows_to_the_same_bound_as_on_legacy(monkeypatch):
    """Production (and the stand-in) holds one entity to about one sustained write a second on Firestore as on legacy:
    past it an adaptive counter's blind increments are refused for contention, so it grows as on legacy. The
    planner's Firestore answer is legacy's, and both follow the model's figure (ENTITY_WRITES_PER_S), not one of the
    planner's own: at 2 writes a second an entity, half the shards."""
    firestore, legacy = (answers(counter.plan_counter(Rate(50), 600, backend=b)) for b in ("firestore", "legacy"))
    assert firestore["adaptive_seconds"] == legacy["adaptive_seconds"]
    assert firestore["adaptive_seconds"].text == "64 shards after 6 windows, about 3.0 s into the peak"
    assert "collide" not in firestore["adaptive_seconds"].text
    monkeypatch.setattr(production_latency, "ENTITY_WRITES_PER_S", 2.0)
    for backend in ("firestore", "legacy"):
        plan = counter.plan_counter(Rate(50), 600, backend=backend)
        got = answers(plan)
        assert got["shards"].value == 25, backend
        assert got["adaptive_seconds"].text.startswith("32 shards after 5 windows"), backend
        rate = next(f for f in plan.figures if f.name == "sustained writes a second to one entity")
        assert rate.value == 2.0 and rate.whose == "production"
        assert rate.source == ("https://cloud.google.com/firestore/docs/solutions/counters" if backend == "firestore"
                               else "https://cloud.google.com/datastore/docs/concepts/structuring_for_strong_consistency")


def test_blog_page_bills_and_hit_rate_by_hand():
    assert blog.page_reads(10_000, 0) == (11, 10)  # the page and the next one's first; the page alone
    assert blog.page_reads(10_000, 5_000) == (11, 5_010)
    assert blog.page_reads(10_000, 9_995) == (5, 10_000)
    got = answers(blog.plan_blog(10_000, 5_000, Rate(100), Rate(50), Rate(6, "hour")))
    assert got["index_reads"].value == 11 and got["offset_reads"].value == 5_010
    assert blog.front_page_reads(10_000) == 1 + 11 + 10  # the BlogIndex, the page and one more, its counters
    assert blog.after_post_reads(10_000) == 1 + 11 + 1  # the BlogIndex, the page and one more, the new entry's count
    assert got["miss_reads"].value == 13 and "22 cold" in got["miss_reads"].text and "11 when" in got["miss_reads"].text
    assert got["hit_rate"].value == round(1 - 50 / (13 * 100), 4) and "97.73% if every miss were cold" in \
        got["hit_rate"].text
    # One miss a post at best: 6 posts an hour over 100 views a second
    assert got["hit_rate_reachable"].value == round(1 - 6 / 3600 / 100, 6)
    assert "6 posts an hour" in got["hit_rate_reachable"].text and "fits" in got["hit_rate_reachable"].text
    assert got["post_rpcs"].value == 3 and got["posts_in_turn"].value == 1
    assert answers(blog.plan_blog(10, 0, Rate(1), Rate(1000), Rate(1)))["hit_rate"].value == 0  # a budget for all
    # 50 posts a minute against 10 views a second: a miss in 12 views at best, not the 99% the budget needs
    busy = answers(blog.plan_blog(10_000, 0, Rate(10), Rate(1), Rate(50, "minute")))
    assert busy["hit_rate_reachable"].value == round(1 - 50 / 60 / 10, 6) and "does not fit" in \
        busy["hit_rate_reachable"].text
    # No post at all: the cached page still expires after PAGE_LIFETIME, a miss an hour
    quiet = answers(blog.plan_blog(10_000, 0, Rate(1), Rate(1), Rate(0)))
    assert quiet["hit_rate_reachable"].value == round(1 - 1 / 3600, 6)


def test_rates_are_taken_in_the_unit_given():
    """A rate a second, a minute or an hour: 1,200 comments a minute are 20 a second, and the figure says what was
    given; two units for one rate are refused, naming it."""
    by_minute = service.plan("comments", {"comments_per_minute": 1200, "writers": 200})
    by_second = service.plan("comments", {"comments_per_second": 20, "writers": 200})
    assert by_minute["answers"] == by_second["answers"]
    assert by_minute["inputs"]["comments_per_minute"] == 1200
    given = next(f for f in by_minute["figures"] if f["whose"] == "yours" and f["name"] == "comments on one entry")
    assert (given["value"], given["unit"]) == (1200, "comments/min")
    with pytest.raises(service.Unprocessable) as refused:
        service.plan("comments", {"comments_per_minute": 1, "comments_per_hour": 1, "writers": 1})
    assert refused.value.code == "bad_comments" and refused.value.status == 422
    hourly = service.plan("blog", {"entries": 10, "depth": 0, "readers_per_hour": 3600, "read_budget_per_minute": 60,
                                   "posts_per_hour": 1})
    assert hourly["answers"] == service.plan("blog", {"entries": 10, "depth": 0, "readers_per_second": 1,
                                                       "read_budget_per_second": 1, "posts_per_hour": 1})["answers"]


def test_no_figure_or_answer_says_one_in_the_plural():
    """'1 shards', '1 writes/s', '1 RPCs' were the planner's own words; each now reads as English."""
    for planner, inputs in (("counter", {"writes_per_second": 1, "peak_seconds": 1}),
                            ("comments", {"comments_per_second": 1, "writers": 1}),
                            ("blog", {"entries": 1, "depth": 0, "readers_per_second": 1, "read_budget_per_second": 1}),
                            ("request", {"rpcs": {"Lookup": 1}, "cache_calls": 1, "reads": 1}),
                            ("batch", {"entities": 1, "backend": "legacy"})):
        plan = service.plan(planner, inputs)
        said = [f"{f['value']:g} {f['unit']}" for f in plan["figures"]] + [a["text"] for a in plan["answers"]]
        said += plan["arithmetic"]
        wrong = [text for text in said if re.search(r"(?<![\d.,])1 (shards|writes|RPCs|queries|calls|entities|reads|"
                                                    r"increments|attempts|windows)\b", text)]
        assert not wrong, (planner, wrong)


def test_comments_headroom_and_bills_by_hand():
    got = answers(comments.plan_comments(Rate(20), 200, backend="legacy"))
    assert got["designed_headroom"].value == 10  # 200 writers x 1 write/s each / 20 comments/s
    assert got["shared_headroom"].value == 0.05  # 1 write/s / 20 comments/s
    assert got["counter_shards"].value == 20
    assert got["designed_bill"].value == 3.3 and got["shared_bill"].value == 2.1  # 2 reads 3 writes; 1 read 2 writes
    assert answers(comments.plan_comments(Rate(20), 200))["designed_bill"].value == 3.0  # Firestore: a blind count


def test_the_comments_planner_names_the_write_budget_a_writer_meets_first():
    """Each person may post Settings.write_budget's comments a window, then gets a 429 (core/budget.py; the figures
    are tests/test_write_budget.py's): 20 comments a second from 200 people is 0.1 a second each, which spends a
    budget of 20 in 200 s, long before any entity's limit; one comment a minute each stays within it."""
    budget = WriteBudget()
    got = answers(comments.plan_comments(Rate(20), 200))["write_budget"]
    assert got.value == budget.comments
    assert got.text.startswith(f"{budget.comments} comments in {budget.window // 60} minutes a person, then 429")
    assert f"spends it in {budget.comments / 0.1:.0f} s" in got.text
    slow = answers(comments.plan_comments(Rate(200, "minute"), 200))["write_budget"]
    assert "stays within it" in slow.text


def test_request_time_and_bill_by_hand():
    got = answers(request.plan_request({"Lookup": 1, "RunQuery": 1}, cache_calls=2, reads=11))
    assert got["rpcs"].value == 2 and got["median_ms"].value == 14.5 + 19 + 2 * 1.0
    lookup, query = production_latency.LOOKUP, production_latency.RUN_QUERY
    assert got["p99_ms"].value == round(lookup.p99_ms + query.p99_ms + 2 * production_latency.CACHE.p99_ms, 1)
    assert got["usd_per_million"].value == 3.3
    multi = answers(request.plan_request({"Commit": 1}, profile="multi-region"))
    assert multi["median_ms"].value == production_latency.MULTI_REGION_COMMIT.median_ms
    assert answers(request.plan_request({}))["usd_per_million"].value == 0


def test_each_plan_shows_its_arithmetic_and_whose_each_figure_is():
    for name, spec in service.PLANNERS.items():
        plan = service.plan(name, spec.example)
        assert plan["planner"] == name and plan["arithmetic"] and plan["answers"]
        whose = {f["whose"] for f in plan["figures"]}
        assert {"yours", "production"} <= whose, name
        assert whose & {"model", "inference"}, name  # every planner waits somewhere


@pytest.mark.parametrize(("planner", "inputs", "code"), [
    ("nope", {}, "bad_planner"),
    (None, {}, "bad_planner"),
    ("counter", None, "bad_inputs"),
    ("counter", [], "bad_inputs"),
    ("counter", {"peak_seconds": 1}, "bad_writes_per_second"),
    ("counter", {"writes_per_second": -1, "peak_seconds": 1}, "bad_writes_per_second"),
    ("counter", {"writes_per_second": 1.5, "peak_seconds": 1}, "bad_writes_per_second"),
    ("counter", {"writes_per_second": "5", "peak_seconds": 1}, "bad_writes_per_second"),
    ("counter", {"writes_per_second": True, "peak_seconds": 1}, "bad_writes_per_second"),
    ("counter", {"writes_per_second": 10**7, "peak_seconds": 1}, "bad_writes_per_second"),
    ("counter", {"writes_per_second": 1, "peak_seconds": 1, "extra": 1}, "bad_inputs"),
    ("counter", {"writes_per_second": 1, "peak_seconds": 1, "backend": "mysql"}, "bad_backend"),
    ("blog", {"entries": 10, "depth": 10, "readers_per_second": 1, "read_budget_per_second": 1}, "bad_depth"),
    ("blog", {"entries": 10**11, "depth": 0, "readers_per_second": 1, "read_budget_per_second": 1}, "bad_entries"),
    ("comments", {"comments_per_second": 1, "writers": 0}, "bad_writers"),
    ("request", {"rpcs": {"Get": 1}}, "bad_rpcs"),
    ("request", {"rpcs": {"Lookup": 1001}}, "bad_rpcs"),
    ("request", {"rpcs": ["Lookup"]}, "bad_rpcs"),
    ("request", {"profile": None}, "bad_profile"),
    ("request", {"appstats": 0}, "bad_appstats"),
    ("request", {"appstats": "12"}, "bad_appstats"),
    ("request", {"appstats": 12, "rpcs": {"Lookup": 1}}, "bad_inputs"),
    ("batch", {"entities": 10, "fanout": 1}, "bad_fanout"),
    ("batch", {"entities": 10, "page_size": 501}, "bad_page_size"),
])
def test_bad_input_is_refused_naming_what_is_wrong(planner, inputs, code):
    with pytest.raises(service.Unprocessable) as refused:
        service.plan(planner, inputs)
    assert refused.value.code == code and refused.value.status == 422


def test_the_openapi_document_states_the_planners_own_bounds():
    """planner/openapi.yaml is written by hand: its bounds, required fields and choices must be PLANNERS'."""
    document = yaml.safe_load((Path(service.__file__).parent / "openapi.yaml").read_text())
    schemas = document["components"]["schemas"]
    variants = document["paths"]["/api/plan"]["post"]["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    recorded = [v for v in variants if v["properties"]["inputs"]["$ref"].endswith("/RecordedInputs")]
    assert [v["properties"]["planner"]["const"] for v in recorded] == ["request"]
    assert set(schemas["RecordedInputs"]["properties"]) == {"appstats", "profile"}
    assert schemas["RecordedInputs"]["properties"]["appstats"]["maximum"] == service.MOST_REQUEST_ID
    variants = [v for v in variants if v not in recorded]
    assert [v["properties"]["planner"]["const"] for v in variants] == list(service.PLANNERS)
    assert schemas["Plan"]["properties"]["planner"]["enum"] == list(service.PLANNERS)
    assert set(schemas["Plan"]["properties"]["figures"]["items"]["properties"]["whose"]["enum"]) == set(figures.WHOSE)
    for variant in variants:
        spec = service.PLANNERS[variant["properties"]["planner"]["const"]]
        inputs = schemas[variant["properties"]["inputs"]["$ref"].rsplit("/", 1)[1]]
        assert inputs["additionalProperties"] is False
        assert set(inputs.get("required", [])) == {n.name for n in spec.numbers if n.default is None and not n.rate}
        # a rate: exactly one of its units when required, at most one when it has a default
        one_of = [[alt["required"] for alt in rule["oneOf"] if "required" in alt] for rule in inputs.get("allOf", [])]
        assert one_of == [[[field] for field in n.fields()] for n in spec.numbers if n.rate]
        for rule, number in zip(inputs.get("allOf", []), [n for n in spec.numbers if n.rate], strict=True):
            assert ("not" in rule["oneOf"][-1]) == (number.default is not None), number
        for number in spec.numbers:
            for i, field in enumerate(number.fields()):
                stated = inputs["properties"][field]
                assert (stated["minimum"], stated["maximum"], stated.get("default")) == (
                    number.low, number.high, number.default if i == 0 else None), field
        for choice in spec.choices:
            ref = inputs["properties"][choice.name]["$ref"].rsplit("/", 1)[1]
            assert tuple(schemas[ref]["enum"]) == choice.options and schemas[ref]["default"] == choice.options[0]
        if spec.rpcs:
            rpcs = inputs["properties"]["rpcs"]
            assert tuple(rpcs["properties"]) == service.RPC_METHODS
            assert {(p["minimum"], p["maximum"]) for p in rpcs["properties"].values()} == {(0, service.MOST_RPCS)}


# --- the planner against the app's own benchmarks --------------------------------------------------------------------

def tables(name):
    """{section heading: [row as {column: cell}]} of each markdown table in bench/results/<name>."""
    return markdown_tables((RESULTS / name).read_text(encoding="utf-8"))


def backend_of(heading):
    return "firestore" if heading.startswith("Firestore") else "legacy"


def test_blog_page_bills_are_exactly_the_benchmarks():
    """bench/results/blog.md: a blog of 10,000 entries, pages of 10 by index and by offset at each depth."""
    sections = tables("blog.md")
    paged = [h for h in sections if "depth" in sections[h][0]]
    assert len(paged) == 4
    for heading in paged:
        for row in (row for row in sections[heading] if "depth" in row):
            by_index, by_offset = blog.page_reads(10_000, int(row["depth"]))
            assert bill_cell(billing.Billed(reads=by_index)) == row["by index billed"], (heading, row)
            assert bill_cell(billing.Billed(reads=by_offset)) == row["by offset billed"], (heading, row)
        # the front page's table after it: rendered from Datastore on every view (no cache), what a miss bills
        rendered = next(row for row in sections[heading] if row.get("front page") == "datastore")
        assert bill_cell(billing.Billed(reads=blog.front_page_reads(10_000))) == rendered["billed per view"]


def test_a_front_page_miss_after_a_post_bills_what_the_planner_says(client, auth):
    """The blog planner bills a miss as the running app pays it: the first view of the front page after a post reads
    the BlogIndex again, the page's query and the new entry's comment counter (blog.AFTER_POST_RPCS, billed
    blog.after_post_reads), measured here on the real stack, or the query alone once the poster's form has shown
    them the new entry; the cold worst case (nothing cached) reads every shown entry's counter
    (blog.front_page_reads, as bench/results/blog.md's `datastore` front page)."""
    auth.admin()
    for i in range(blog.BLOG_PAGE + 2):
        assert client.post("/api/blogs/planned/entries", json={"title": f"{i}", "body": "b"}).status_code == 201
    client.get("/blog/planned")
    assert billed(client.get("/blog/planned"))[:3] == (0, 0, 0)  # cached: the hit
    assert client.post("/api/blogs/planned/entries", json={"title": "new", "body": "b"}).status_code == 201
    auth.sign_out()
    after = client.get("/blog/planned")
    assert timing(after)["datastore"][1] == blog.AFTER_POST_RPCS
    assert billed(after)[:3] == (blog.after_post_reads(blog.BLOG_PAGE + 3), 0, 0)
    assert billed(client.get("/blog/planned"))[:3] == (0, 0, 0)  # one miss a post: the next view hits again
    # Posted with the form, the poster lands on the new entry's page first: the miss is the query alone
    auth.admin()
    r = client.post("/blog/planned/entries", data={"csrf_token": csrf_token(client, "/blog/planned"),
                                                   "title": "by form", "body": "b"}, follow_redirects=True)
    assert r.status_code == 200 and "by form" in r.get_data(as_text=True)
    after_form = client.get("/blog/planned")
    assert timing(after_form)["datastore"][1] == blog.AFTER_FORM_POST_RPCS
    assert billed(after_form)[:3] == (blog.after_post_reads(blog.BLOG_PAGE + 4, after_the_form=True), 0, 0)


def test_comment_bills_are_exactly_the_benchmarks():
    """bench/results/comments.md: a designed comment (with its count) and a shared-sequence one, on each backend."""
    sections = tables("comments.md")
    compared = 0
    for heading, rows in sections.items():
        if "variant" not in rows[0]:
            continue
        designed, shared = comments.comment_bills(backend_of(heading))
        by_variant = {row["variant"]: row["billed per comment, alone"] for row in rows}
        assert by_variant["designed"] == bill_cell(designed) == by_variant["ceiling"], heading
        assert by_variant["shared"] == bill_cell(shared), heading
        compared += 1
    assert compared == 4


def test_counter_bills_are_exactly_the_benchmarks():
    """bench/results/counters.md: the app's counters' increments (general, sized, adaptive), and a total summed from
    20 shards, on each backend."""
    text = (RESULTS / "counters.md").read_text(encoding="utf-8")
    sections = tables("counters.md")
    compared = 0
    for heading, rows in sections.items():
        if "variant" not in rows[0]:
            continue
        backend = backend_of(heading)
        for row in rows:
            if row["variant"] in ("general", "sized", "adaptive"):
                assert row["billed per increment, alone"] == bill_cell(figures.INCREMENT_BILL[backend]), row
                compared += 1
    assert compared == 12
    twenty = answers(counter.plan_counter(Rate(20), 1))
    assert twenty["shards"].value == 20
    summed = re.findall(r"summed from 20 shards [\d.]+ µs, billed (\d+ reads \(\$[\d.]+/M\))", text)
    assert summed and set(summed) == {bill_cell(billing.Billed(reads=20))}
    assert twenty["total_read"].value == billing.Billed(reads=20).usd_per_million()


def test_the_counter_planner_quotes_one_shards_measured_rate():
    """The shards by this machine's benchmark: bench/results/counters.md's `ceiling` row (one-shard counters, one
    writer each: its commits a second over its writers) under the profile asked, on the backend asked, read once per
    process, not per request."""
    compared = 0
    counter.measured_per_shard.cache_clear()
    for heading, rows in tables("counters.md").items():
        if "LATENCY=" not in heading:
            continue
        row = next(row for row in rows if row["variant"] == "ceiling")
        plan = counter.plan_counter(Rate(50), 600, backend_of(heading), heading.split("LATENCY=")[1])
        measured = next(f for f in plan.figures if f.whose == "bench")
        per_shard = round(float(row["commits/s"]) / int(row["writers"]), 3)
        assert measured.value == per_shard and measured.unit == "increments/s", heading
        assert measured.source.startswith("bench/results/counters.md, 20") and "its ceiling row" in measured.source
        assert answers(plan)["bench_shards"].value == math.ceil(50 / per_shard), heading
        compared += 1
    assert compared >= 4
    assert counter.measured_per_shard.cache_info().misses == 1  # the file read once, however many plans


def test_the_counter_planner_without_the_benchmark_says_so(monkeypatch, tmp_path):
    """bench/ is not deployed: there the answer still works, and says the figure was not measured."""
    monkeypatch.setattr(counter, "COUNTERS_RESULTS", tmp_path / "bench" / "results" / "counters.md")
    monkeypatch.setattr(counter, "REPO", tmp_path)
    plan = counter.plan_counter(Rate(50), 600, "legacy")
    got = answers(plan)
    assert got["bench_shards"].value is None and "not measured in this deployment" in got["bench_shards"].text
    assert got["shards"].value == 50 and "bench" not in {f.whose for f in plan.figures}
    assert service.plan("counter", {"writes_per_second": 5, "peak_seconds": 1})["answers"]


def test_a_posts_critical_path_is_the_benchmarks():
    """bench/results/posts.md: one post's critical path, 3 RPCs in turn; with its cache calls, its time at the model's
    medians is the one the benchmark reports beside its serial bound, exactly, under each profile."""
    text = (RESULTS / "posts.md").read_text(encoding="utf-8")
    bounds = re.findall(r"(LATENCY=[a-z-]+): 20 posts .*?\((\d+) RPCs and (\d+) cache calls a post: (\d+) ms at the "
                        r"model's medians", text)
    assert len(bounds) == 4
    for profile, rpcs, cache_calls, ms in bounds:
        assert answers(blog.plan_blog(10, 0, Rate(1), Rate(1), Rate(1)))["post_rpcs"].value == int(rpcs)
        plan = request.plan_request(dict(figures.TRANSACTION), cache_calls=int(cache_calls),
                                    profile=profile.split("=")[1])
        assert round(answers(plan)["median_ms"].value) == int(ms), profile


# A page's median is the model's waits plus this machine's own time for it (the emulator answering, the app rendering,
# HTTP on loopback): measured below 25 ms a page on pages.md's 2 cores, where the median minus the model's medians
# runs from 5 ms (/signin, which waits for nothing) to 24 ms (/counters, which renders every counter). So a page's
# median must lie between every call at its p1 and every call at its p99 plus that allowance: a planner that lost a
# call or counted one twice falls out of it for most pages.
MACHINE_MS = 25.0


def test_page_times_and_bills_are_within_the_models_spread():
    """bench/results/pages.md under both profiles: one request at a time, each page's RPCs by method as
    tests/test_budgets.py pins them, its cache calls and its bill as measured: the request planner's bill equals the
    measured one, and the measured median lies in the model's band."""
    compared = 0
    for heading, rows in tables("pages.md").items():
        profile = heading.split("LATENCY=")[1]
        for row in rows:
            path = row["page"].strip("`")
            if path not in BUDGETS:
                continue
            cache_calls = int(row["cache calls, visitor / admin"].split("/")[0])
            bill = row["billed per view, visitor / admin"].split(" / ")[0]
            reads = int(bill.split(" read")[0]) if "read" in bill else 0
            plan = request.plan_request(BUDGETS[path], cache_calls=cache_calls, reads=reads, profile=profile)
            assert int(row["Datastore RPCs, visitor / admin"].split("/")[0]) == answers(plan)["rpcs"].value, path
            assert bill_cell(billing.Billed(reads=reads)) == bill, path
            trips = [(figures.round_trip(m, profile), n) for m, n in BUDGETS[path].items()]
            trips.append((production_latency.CACHE, cache_calls))
            low = sum(trip.quantile_ms(0.01) * n for trip, n in trips)
            high = answers(plan)["p99_ms"].value + MACHINE_MS
            assert low <= float(row["visitor median ms"]) <= high, (heading, path, low, high)
            compared += 1
    assert compared >= 30


# --- the API and the page (the real stack) ---------------------------------------------------------------------------

def test_api_answers_each_planner_and_writes_nothing(client):
    for name, spec in service.PLANNERS.items():
        r = client.post("/api/plan", json={"planner": name, "inputs": spec.example})
        assert r.status_code == 200, r.get_json()
        assert r.get_json() == service.plan(name, spec.example)
        assert "datastore;desc=\"0 RPCs\"" in r.headers["Server-Timing"]  # computed: nothing read, nothing written


@pytest.mark.parametrize("body", [
    {"planner": "counter"},
    {"planner": "counter", "inputs": {"writes_per_second": 0, "peak_seconds": 1}},
    {"planner": "counter", "inputs": {"writes_per_second": 1, "peak_seconds": 1}, "extra": True},
    {"planner": "batch", "inputs": {}},
    {"inputs": {}},
])
def test_api_refuses_bad_input_with_the_error_shape(client, body):
    r = client.post("/api/plan", json=body)
    assert r.status_code == 422 and set(r.get_json()["error"]) == {"code", "message"}
    assert "datastore;desc=\"0 RPCs\"" in r.headers["Server-Timing"]


def test_a_recorded_request_is_planned_for_admins_only(client, auth):
    """{"appstats": id}: the calls on the recorded request's critical path and its bill, read from the shared cache."""
    auth.admin()
    assert client.get("/api/numbers").status_code == 404  # one Lookup, recorded by Appstats
    read = next(r for r in client.get("/api/appstats").get_json()["requests"] if r["path"] == "/api/numbers")
    r = client.post("/api/plan", json={"planner": "request", "inputs": {"appstats": read["id"]}})
    assert r.status_code == 200, r.get_json()
    plan = r.get_json()
    assert plan["inputs"] == {"appstats": read["id"], "profile": "production"}
    got = {a["name"]: a["value"] for a in plan["answers"]}
    assert got["rpcs"] == 1 and got["median_ms"] >= production_latency.LOOKUP.median_ms
    # the request's figures are its record's, not the reader's input
    recorded = [f for f in plan["figures"] if f["whose"] == "record"]
    assert {f["name"] for f in recorded} >= {"Lookup RPCs", "cache calls", "billed reads"}
    assert all(f["source"].startswith(f"/appstats request {read['id']}, ") for f in recorded)
    assert "yours" not in {f["whose"] for f in plan["figures"]}
    assert {f["whose_label"] for f in recorded} == {figures.WHOSE["record"]}
    assert "RunQuery" not in r.headers["Server-Timing"] and "Commit" not in r.headers["Server-Timing"]  # the cache's
    gone = client.post("/api/plan", json={"planner": "request", "inputs": {"appstats": 1}})
    assert gone.status_code == 404
    auth.sign_in()
    assert client.post("/api/plan", json={"planner": "request", "inputs": {"appstats": read["id"]}}).status_code == 403
    auth.sign_out()
    assert client.post("/api/plan", json={"planner": "request", "inputs": {"appstats": read["id"]}}).status_code == 401


def recorded_in(html):
    """(method, path) of each request the page's select lists, by its time: "01:31:27 UTC GET /numbers: 1 RPC"."""
    return re.findall(r'<option value="\d+"[^>]*>\d\d:\d\d:\d\d UTC (\w+) ([^:]+):', html)


def test_an_admin_picks_a_recorded_request_from_the_list_on_the_page(client, auth):
    """/numbers lists the requests /appstats recorded, for admins only (it says who asked for what), read from the
    cache: the page still reads one entity (its Lookup, tests/test_budgets.py) and writes nothing. The one picked is
    planned as the API plans its id."""
    assert "data-recorded" not in client.get("/numbers").get_data(as_text=True)  # a visitor: no list
    auth.admin()
    assert client.get("/api/numbers").status_code == 404  # one Lookup, recorded by Appstats
    read = next(r for r in client.get("/api/appstats").get_json()["requests"] if r["path"] == "/api/numbers")
    page = client.get("/numbers")
    html = page.get_data(as_text=True)
    at = read["at"][11:19]  # its time, method and path; the planner's own and the sign-in requests left out
    assert "data-recorded" in html and f'<option value="{read["id"]}">{at} UTC GET /api/numbers: 1 RPC,' in html
    assert {("GET", "/api/numbers"), ("GET", "/numbers")} <= set(recorded_in(html))
    assert "/api/session" in {r["path"] for r in client.get("/api/appstats").get_json()["requests"]}
    assert "/api/session" not in {path for _, path in recorded_in(html)}
    spent = timing(page)["datastore"]
    assert spent[:2] == (1, {"Lookup": 1}), spent  # the list is the cache's: no Datastore RPC more, no write
    r = client.post("/numbers/plan", data={"csrf_token": csrf_token(client, "/numbers"), "planner": "request",
                                           "appstats": str(read["id"]), "profile": "production"})
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and 'data-plan="request"' in html
    assert f"request {read['id']}, GET /api/numbers" in html and f'<option value="{read["id"]}" selected>' in html
    assert client.post("/api/plan", json={"planner": "request", "inputs": {"appstats": read["id"]}}).status_code == 200
    kept = {r["path"] for r in client.get("/api/appstats").get_json()["requests"]}
    assert {"/api/plan", "/numbers/plan"} <= kept
    listed = {path for _, path in recorded_in(client.get("/numbers").get_data(as_text=True))}
    assert "/numbers" in listed and not listed & {"/api/plan", "/numbers/plan", "/api/session"}, listed
    auth.sign_in()
    assert "data-recorded" not in client.get("/numbers").get_data(as_text=True)  # signed in, not an admin


def test_api_needs_a_json_body(client):
    assert client.post("/api/plan", data="planner=counter",
                       content_type="application/x-www-form-urlencoded").status_code == 415
    assert client.post("/api/plan", data="[1]", content_type="application/json").status_code == 400


def test_the_numbers_page_has_a_form_for_each_planner_and_shows_an_answer(client):
    html = client.get("/numbers").get_data(as_text=True)
    for name in service.PLANNERS:
        assert f'data-planner="{name}"' in html
    assert "data-plan=" not in html
    token = csrf_token(client, "/numbers")
    r = client.post("/numbers/plan", data={"csrf_token": token, "planner": "blog", "entries": "10000",
                                           "depth": "9990", "readers": "100", "readers_per": "second",
                                           "read_budget": "50", "read_budget_per": "second", "posts": "50",
                                           "posts_per": "minute", "profile": "production"})
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and 'data-plan="blog"' in html
    assert "10 reads, $3.00 a million" in html and "10000 reads, $3000.00 a million" in html
    assert "50 posts a minute, each a miss" in html and "50 posts/min" in html  # in the unit given
    assert 'value="9990"' in html and '<option value="minute" selected>' in html  # what was sent stays in the form
    assert "https://cloud.google.com/datastore/pricing" in html
    r = client.post("/numbers/plan", data={"csrf_token": token, "planner": "request", "rpcs.Lookup": "1",
                                           "cache_calls": "2", "reads": "1"})
    assert 'data-plan="request"' in r.get_data(as_text=True)
    for name, spec in service.PLANNERS.items():  # the form takes the API's names too (posts_per_hour)
        sent = {k: v for k, v in spec.example.items() if k != "rpcs"}
        r = client.post("/numbers/plan", data={"csrf_token": token, "planner": name, **sent})
        assert r.status_code == 200 and f'data-plan="{name}"' in r.get_data(as_text=True), name


def test_the_form_refuses_bad_input_on_the_page(client):
    token = csrf_token(client, "/numbers")
    r = client.post("/numbers/plan", data={"csrf_token": token, "planner": "counter", "writes": "-3",
                                           "writes_per": "second", "peak_seconds": "10"})
    html = r.get_data(as_text=True)
    assert r.status_code == 422 and "writes_per_second must be a whole number" in html and "data-plan=" not in html
    r = client.post("/numbers/plan", data={"csrf_token": token, "planner": "nope"})
    assert r.status_code == 422 and "planner must be one of" in r.get_data(as_text=True)
    assert client.post("/numbers/plan", data={"planner": "counter"}).status_code == 400  # no CSRF token


def test_the_lessons_worked_examples_are_the_planners_answers():
    """docs/lessons/numbers.md quotes each planner's example answers in `code`: each must be what the planner says."""
    lesson = (Path(__file__).resolve().parent.parent / "docs" / "lessons" / "numbers.md").read_text(encoding="utf-8")
    section = lesson.split("## Plan before you build")[1].split("\n## ")[0]
    said = " | ".join(a["text"] for name, spec in service.PLANNERS.items()
                      for a in service.plan(name, spec.example)["answers"])
    quoted = [" ".join(q.split()) for q in re.findall(r"`([^`]+)`", section) if re.search(r"\d", q)]
    assert len(quoted) >= 10
    for text in quoted:
        assert text in said, text


def billed_as(text):
    """'10101 reads, 10000 writes...' as a Billed."""
    reads, writes = re.match(r"(\d+) reads, (\d+) writes", text).groups()
    return billing.Billed(reads=int(reads), writes=int(writes))


def test_the_mapper_tree_by_hand():
    """10,000 entities, pages of 100, fan-out 4: the root lists 501 keys, keeps 100, hands out 4 pages and splits the
    9,500 beyond into 4 ranges of 2,375; each of those hands out 4 pages and splits 1,875 into 4 of 468 or 469, which
    keep 100 and hand out 3 pages and one of 68 or 69. Tasks 1 + 4 + 4 x (1 + 4) + 16 x (1 + 4) = 105, depth 4."""
    tree = batch.fan_out(10_000, 100, 4, 100)
    assert (tree.tasks, tree.range_tasks, tree.handing, tree.depth) == (105, 21, 21, 4)
    # Its critical path: the start (2 queries, 1 transaction), the root's read of the job, 3 levels' listing and
    # first transaction, the last page's one transaction, then the end: 4 levels of records read, 1 transaction with
    # 2 reads to settle.
    start, chain, end = 2 + 3 * 1, 1 + 3 * (1 + 3) + 3, 4 + 3 + 2
    assert tree.transactions == 105 and tree.path_rpcs == start + chain + end == 30
    assert tree.path == batch.Calls(queries=2 + 3, lookups=1 + 4 + 2, transactions=1 + 3 + 1 + 1, hops=4)
    one = batch.fan_out(24, 100, 4, 24)  # one page: one task, its listing and its one transaction
    assert (one.tasks, one.depth, one.transactions) == (1, 1, 1) and one.path_rpcs == start + 1 + (1 + 3) + (1 + 3 + 2)
    # Legacy answers a query in batches of 300 keys: the root's listing of 501 keys takes two; 24 accounts a
    # transaction, so the last page takes 5 (100 / 24). The tree's shape is the same.
    legacy = batch.fan_out(10_000, 100, 4, 24, "legacy")
    assert (legacy.tasks, legacy.depth) == (tree.tasks, tree.depth)
    assert legacy.path_rpcs == (1 + 2 + 3 * 1) + (1 + (2 + 3) + (2 + 3) + (2 + 3) + 5 * 3) + (4 + 3 + 2) == 46
    assert [batch.queries_for(n, 501, "legacy") for n in (1, 300, 301, 501)] == [1, 2, 2, 2]
    assert batch.queries_for(300, 300, "legacy") == 1 and batch.queries_for(501, 501, "firestore") == 1
    huge = batch.fan_out(10**10, 1, 2, 24)  # the bounds' largest tree, computed by range size, not by task
    assert huge.tasks == 10**10 and huge.depth < 40
    # The walk: 100 pages, 5 transactions a page of 100 at 24 a transaction (legacy), and the empty page legacy asks
    assert batch.walk_critical_path(10_000, 100, 24, "legacy") == (101 + 3 * 500, 101)
    assert batch.walk_critical_path(10_000, 100, 100, "firestore") == (100 + 3 * 100, 100)
    assert batch.walk_critical_path(150, 100, 100, "legacy") == (2 + 3 * 2, 2)


@pytest.mark.parametrize("entities, page, fanout", [(750, 100, 4), (10_000, 100, 4), (10_000, 500, 4),
                                                   (30_000, 1000, 8), (2_000, 10, 3)])
def test_the_planners_tree_is_the_mappers_own_split(entities, page, fanout):
    """The planner's tree is the one mapper/tree.py's split cuts, here run task by task on evenly spread keys
    (consecutive ids, no __scatter__ samples). Among the shapes: a rest just over half a listing, which the mapper
    splits in two (750 in pages of 100), and pages whose keys exceed mapper/queueing.py's HANDED_BYTES, of which the
    mapper hands out fewer (pages of 500 and of 1,000)."""
    from google.auth.credentials import AnonymousCredentials

    from mapper.chunks import scan_limit
    from mapper.models import MapperJob
    from mapper.task import TOTAL_WEIGHT, TaskPayload
    from mapper.tree import split as _split

    job = MapperJob(page_size=page, fanout=fanout, samples=[])

    def key(i):
        return ndb.Key("Account", 2 ** 52 + i, project="scalable-demo", namespace=None)

    def mappers_tree(lo, hi):
        """(tasks, depth, range tasks, range tasks that handed out pages) of a range task over ids (lo, hi]."""
        listed = [key(i) for i in range(lo + 1, min(hi, lo + scan_limit(page, fanout)) + 1)]
        if len(listed) <= page:
            return 1, 1, 1, 0
        payload = TaskPayload("t", "0", key(lo).urlsafe().decode(), key(hi).urlsafe().decode(), TOTAL_WEIGHT)
        pages, cut = _split(job, payload, listed)
        ranges = [mappers_tree(lo.id() - 2 ** 52, hi.id() - 2 ** 52) for lo, hi in cut]
        return (1 + len(pages) + sum(r[0] for r in ranges), 1 + max([1 if pages else 0] + [r[1] for r in ranges]),
                1 + sum(r[2] for r in ranges), (1 if pages else 0) + sum(r[3] for r in ranges))

    with ndb.Client(project="scalable-demo", credentials=AnonymousCredentials()).context():
        expected = mappers_tree(0, entities)
    tree = batch.fan_out(entities, page, fanout, 24)
    assert (tree.tasks, tree.depth, tree.range_tasks, tree.handing) == expected


def test_the_batch_planner_on_a_new_kind_with_the_queue_and_money_a_job():
    """The wall time as the 500/50/5 rule holds a new kind (500 operations a second for 5 minutes, 50% more every 5
    minutes), with queue.yaml's dispatch rate and concurrency as devstack's own reader reads them, and each bill in
    dollars a job."""
    from devstack.cloudtasks import load_queues

    queue = load_queues(batch.QUEUE_YAML)["mapper"]
    assert batch.mapper_queue() == batch.Queue(queue.rate, queue.max_concurrent)
    # 1,000,000 writes: 500/s x 300 s, 750/s x 300, 1,125/s x 300 (712,500 in 900 s), the rest at 1,687.5/s
    assert batch.ramped_seconds(1_000_000, 10_000) == pytest.approx(900 + 287_500 / 1687.5)
    assert batch.ramped_seconds(1_000, 10_000) == 2  # within the first 5 minutes
    assert batch.ramped_seconds(1_000, 100) == 10  # a job slower than the rule is its own pace
    plan = batch.plan_batch(1_000_000, 100, 8, 8, "firestore")
    wall = answers(plan)["wall_s"]
    assert f"{batch.ramped_seconds(1_000_000, 1_000_000 / wall.value):.2f} s on a new kind" in wall.text
    assert {(f.name, f.value) for f in plan.figures} >= {("the mapper queue's dispatch rate", queue.rate),
                                                         ("the mapper queue's tasks at once", queue.max_concurrent)}
    tree = batch.fan_out(1_000_000, 100, 8, batch.CHUNKS["firestore"])
    assert wall.value >= round(tree.tasks / queue.rate, 2)  # no faster than the queue dispatches
    # Pages of 500 at 24 accounts a transaction (legacy) keep a task 1.6 s: more than the queue runs at once would be
    # busy, so it is the queue that caps them, however many tasks at once are asked for.

    def wall_with(instances):
        return answers(batch.plan_batch(200_000, 500, 8, instances, "legacy"))["wall_s"].value
    assert wall_with(10_000) == wall_with(queue.max_concurrent) < wall_with(queue.max_concurrent - 1)
    assert next(f for f in plan.figures if f.name.startswith("a new kind")).source == batch.RAMP_SOURCE
    bill = answers(plan)["fan_out_bill"]
    assert bill.text.endswith(f"${bill.value:.4f} a job") and bill.value < 1  # dollars a job, not a million jobs
    assert not [line for line in plan.arithmetic if "per million" in line]


def test_a_jobs_start_bills_the_queries_it_runs():
    """mapper/service.py start_job: the kind's last key and up to SAMPLES __scatter__ keys, keys only. The legacy
    emulator samples about half a kind and answers 300 keys a batch, asking again after a full one: from 600 entities
    the start runs 3 queries there (the stack test below measures it), 2 on Firestore; each RunQuery a billed read."""
    from mapper.service import SAMPLES

    assert SAMPLES > batch.LEGACY_BATCH
    assert [batch.job_start(n, "legacy").queries for n in (599, 600, 10_000)] == [2, 3, 3]
    assert batch.job_start(10_000, "firestore").queries == 2
    legacy = batch.plan_batch(10_000, 100, 4, 8, "legacy")
    assert any("its start's 3 queries" in line for line in legacy.arithmetic)
    for entities, queries in ((599, 2), (600, 3)):
        bill = billed_as(answers(batch.plan_batch(entities, 100, 4, 8, "legacy"))["fan_out_bill"].text)
        tree = batch.fan_out(entities, 100, 4, batch.CHUNKS["legacy"], "legacy")
        # its accounts, a record read a transaction, the listings, the records summed, then the job's own: its start's
        # queries and 1 transaction, the root's read of it, its end's, and the 2 reads that settle the credit
        assert bill.reads == entities + tree.transactions + tree.range_tasks + tree.tasks + queries + 1 + 1 + 1 + 2


@pytest.mark.parametrize("accounts", [580, 640])
def test_a_jobs_start_runs_the_queries_the_planner_bills_on_legacy(legacy_app, accounts):
    """The start of add_credit over a kind of `accounts` on the legacy emulator: its RunQuery RPCs as its own
    Server-Timing counts them are the planner's job_start queries, and its billed reads theirs and its transactions'
    (a read each; 580 accounts: 2 queries, 640: 3)."""
    from accounts import service as accounts_service
    from accounts.models import Account

    client = legacy_app.test_client()
    client.post("/api/session", json={"email": "boss@example.com", "admin": True})
    with runtime.of(legacy_app).context():
        for i in range(0, accounts, 500):
            ndb.put_multi([Account() for _ in range(min(500, accounts - i))])
        for _ in range(2):  # the kept counters exist, their configs in the global cache: any start but the first
            accounts_service.keep_figures()
    r = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 1}})
    assert r.status_code == 202, r.get_json()
    start = batch.job_start(accounts, "legacy")
    assert timing(r)["datastore"][1]["RunQuery"] == start.queries
    assert billed(r)[0] == start.queries + batch.START_TRANSACTIONS


def test_the_batch_planner_quotes_the_benchmarks_wall_time_beside_its_own():
    """bench/results/mapper.md's fan-out, measured in one process and served, beside the model's wall time for the
    same job (its accounts, fan-out and page sizes, bench/mapper.py's); no measured figure for another job."""
    from bench.mapper import ACCOUNTS, BIG_PAGE, FANOUT, PAGE, WORKERS

    assert (batch.BENCH_ENTITIES, batch.BENCH_FANOUT, batch.BENCH_WORKERS, batch.BENCH_PAGES) == (
        ACCOUNTS, FANOUT, WORKERS, (PAGE, BIG_PAGE))
    compared = 0
    for heading, backend, rows in mapper_sections():
        profile = heading.split("LATENCY=")[1] if "LATENCY=" in heading else None
        if profile is None:
            continue
        for page in (PAGE, BIG_PAGE):
            variants = [r for r in rows if r["variant"].startswith("adaptive fan-out")
                        and (f"pages of {page}" in r["variant"]) == (page == BIG_PAGE)]
            walls = {float(r["wall s (median)"]) for r in variants}
            plan = batch.plan_batch(ACCOUNTS, page, FANOUT, WORKERS, backend, profile)
            measured = {f.value for f in plan.figures if f.whose == "bench"}
            assert measured and measured <= walls, (heading, page, measured, walls)
            assert all(f"{m:g} s" in answers(plan)["wall_s"].text for m in measured)
            compared += 1
    assert compared >= 8
    assert not [f for f in batch.plan_batch(ACCOUNTS + 1, PAGE, FANOUT, WORKERS).figures if f.whose == "bench"]


def mapper_sections():
    """(heading, backend, rows) of each of bench/results/mapper.md's tables of variants (a backend and a profile)."""
    return [(heading, backend_of(heading), rows) for heading, rows in tables("mapper.md").items()
            if "variant" in rows[0]]


A_TRANSACTION_AND_A_READ = sum(figures.TRANSACTION.values()) + 1


def one_level(page, backend):
    """A level of the fan-out's critical path: a range task's listing, its first transaction, and the one more read
    of the records a level costs at the job's end."""
    from bench.mapper import FANOUT

    limit = scan_limit(page, FANOUT)
    return batch.queries_for(limit, limit, backend) + A_TRANSACTION_AND_A_READ


# bench/results/mapper.md was measured (2026-11-29) before issue #72 stopped each job start from configuring the two
# kept counters, a transaction each: its fan-out rows carry those 2 transactions (6 RPCs on the critical path, 2 billed
# reads) that the planner, modelling the app as it is, no longer counts. Added back here until `make bench
# BENCH=mapper` is run again; then these two are 0.
BENCH_START_RPCS, BENCH_START_READS = 2 * 3, 2


def test_batch_jobs_against_the_mapper_benchmark():
    """bench/results/mapper.md, 10,000 accounts, pages of 100, fan-out 4, add_credit's chunks. Exactly: the walk's
    critical path and bill, the pipeline's bill. The fan-out: on Firestore (keys split by arithmetic over evenly
    scattered ids) its tasks, depth and critical path exactly; on legacy the ranges are cut at __scatter__ samples,
    which are not even: depth within 1, tasks within 5%, and so its critical path within one level's RPCs (a range
    task's listing, at most two queries on legacy, and its first transaction; one more read of the records at the
    end). Its bill exactly on Firestore, within 1% on legacy (its tree's shape). The pipeline, failing half way, credits
    at least half twice; the workers in flight (8 batches of 500) add at most 4,000."""
    from bench.mapper import ACCOUNTS, BATCH, FANOUT, PAGE, WORKERS

    text = (RESULTS / "mapper.md").read_text(encoding="utf-8")
    compared = 0
    for heading, backend, rows in mapper_sections():
        plan = answers(batch.plan_batch(ACCOUNTS, PAGE, FANOUT, WORKERS, backend))
        by_variant = {row["variant"]: row for row in rows}
        walk, fan = by_variant["one cursor walk"], by_variant[f"adaptive fan-out, {WORKERS} workers"]
        pipeline = next(row for row in rows if row["variant"].startswith("batch pipeline"))
        assert int(walk["critical path, RPCs"]) == plan["walk_rpcs"].value, heading
        assert walk["billed per job"] == bill_cell(billed_as(plan["walk_bill"].text)), heading
        assert pipeline["billed per job"] == bill_cell(billed_as(plan["pipeline_bill"].text)), heading
        tree = batch.fan_out(ACCOUNTS, PAGE, FANOUT, batch.CHUNKS[backend], backend)
        assert plan["critical_rpcs"].value == tree.path_rpcs
        if backend == "firestore":
            assert (int(fan["tasks"]), int(fan["tree depth"])) == (tree.tasks, tree.depth), heading
            assert int(fan["critical path, RPCs"]) == tree.path_rpcs + BENCH_START_RPCS, heading
        else:
            assert abs(int(fan["tree depth"]) - tree.depth) <= 1 and abs(int(fan["tasks"]) / tree.tasks - 1) <= 0.05
            off = int(fan["critical path, RPCs"]) - BENCH_START_RPCS - tree.path_rpcs
            assert abs(off) <= one_level(PAGE, backend), heading
        measured, predicted = billed_as(fan["billed per job"]), billed_as(plan["fan_out_bill"].text)
        measured = billing.Billed(reads=measured.reads - BENCH_START_READS, writes=measured.writes)
        if backend == "firestore":  # the tree the planner models, exactly: so is its bill
            assert (measured.reads, measured.writes) == (predicted.reads, predicted.writes), heading
        for m, p in ((measured.reads, predicted.reads), (measured.writes, predicted.writes)):
            assert abs(m / p - 1) <= 0.01, (heading, fan["billed per job"], plan["fan_out_bill"].text)
        compared += 1
    assert compared >= 4
    for twice in re.findall(r"the pipeline credited ([\d,]+) of", text):
        assert ACCOUNTS // 2 <= int(twice.replace(",", "")) <= ACCOUNTS // 2 + WORKERS * BATCH


def test_the_planner_answers_for_pages_of_500_as_the_benchmark_measured():
    """bench/results/mapper.md's same job given pages of 500 (bench/mapper.py BIG_PAGE), on each backend and profile:
    the planner's tree and bill for that page_size. Its depth exactly; tasks within one, the critical path within one
    transaction and one read (4 RPCs), the bill within 1% or the 2 reads one task's record costs: at this page a range
    cut by key arithmetic (Firestore) or at __scatter__ samples (legacy) holds about, not exactly, its share of keys,
    so whether one more page is left for one more task varies with where the ids fall (Firestore: 20 tasks measured,
    21 modelled). Not within a whole level, as pages of 100 on legacy are: a level's listing of 2,501 keys is 9 of the
    legacy emulator's batches, and a planner that listed pages of 100 would fall within it."""
    from bench.mapper import ACCOUNTS, BIG_PAGE, FANOUT, WORKERS

    compared = 0
    for heading, backend, rows in mapper_sections():
        big = next(row for row in rows if row["variant"].startswith(f"adaptive fan-out, {WORKERS} workers, pages of"))
        assert f"pages of {BIG_PAGE} " in big["variant"], big["variant"]
        tree = batch.fan_out(ACCOUNTS, BIG_PAGE, FANOUT, batch.CHUNKS[backend], backend)
        plan = answers(batch.plan_batch(ACCOUNTS, BIG_PAGE, FANOUT, WORKERS, backend))
        assert int(big["tree depth"]) == tree.depth, (heading, big["tree depth"], tree.depth)
        assert abs(int(big["tasks"]) - tree.tasks) <= 1, (heading, big["tasks"], tree.tasks)
        off = abs(int(big["critical path, RPCs"]) - BENCH_START_RPCS - tree.path_rpcs)
        assert off <= A_TRANSACTION_AND_A_READ, (heading, big["critical path, RPCs"], tree.path_rpcs)
        measured, predicted = billed_as(big["billed per job"]), billed_as(plan["fan_out_bill"].text)
        measured = billing.Billed(reads=measured.reads - BENCH_START_READS, writes=measured.writes)
        for m, p in ((measured.reads, predicted.reads), (measured.writes, predicted.writes)):
            assert abs(m - p) <= max(0.01 * p, 2), (heading, big["billed per job"], plan["fan_out_bill"].text)
        compared += 1
    assert compared >= 4
