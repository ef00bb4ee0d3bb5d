"""The planner: "Numbers Everyone Should Know" turned into answers before a design is built. Each planner is a plain
function from a few whole numbers to a `Plan`: its answers, every figure it used with whose figure it is, and its
arithmetic as lines a person can follow. Nothing here reads or writes Datastore (a recorded request is read from the
shared cache, as /appstats reads it). Every figure is imported from where the app keeps it: core/production_latency.py
for the model's round trips, core/billing.py for the prices, the features' own constants, Google's guidance as the
features' caveats cite it.
"""
import functools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from accounts.credit import ADD_CREDIT
from appstats import records
from blog.service import PAGE_SIZE as BLOG_PAGE
from core import billing, costs, production_latency, runtime
from core.costs import plural
from core.errors import Unprocessable
from core.validate import whole_number
from counters.growth import ContentionWindow
from counters.models import ADAPTIVE_MAX_SHARDS, MAX_SHARDS
from counters.production import CAVEATS as COUNTER_CAVEATS
from mapper.handoff import HANDED_BYTES
from mapper.jobs import MAX_GROUPS
from mapper.service import MAX_FANOUT, MAX_PAGE_SIZE, MIN_FANOUT

# Google's guidance for one entity: about one sustained write a second (the counters' caveat, with its source). The
# guidance is a rate, so the planner divides by it rather than copying it into each answer.
SUSTAINED_WRITES_PER_ENTITY = 1
SUSTAINED_WRITES_SOURCE = COUNTER_CAVEATS[0].source

# What each of the app's writes sends, by backend: on Firestore an increment is a blind server-side increment (one
# Commit, no read); on legacy a transaction that reads its shard (counters/writes.py). A transaction on one entity
# group holds it from its Lookup to its Commit: the writes to it follow one another.
TRANSACTION = {"BeginTransaction": 1, "Lookup": 1, "Commit": 1}
INCREMENT_RPCS = {"firestore": {"Commit": 1}, "legacy": TRANSACTION}
INCREMENT_BILL = {"firestore": billing.Billed(writes=1), "legacy": billing.Billed(reads=1, writes=1)}
# A comment (comments/service.py post_comment): one transaction on the writer's own group, reading their sequence and
# writing it with the comment; then +1 on the entry's comment counter. The shared design: one sequence for everyone.
COMMENT_BILL = billing.Billed(reads=1, writes=2)
BACKENDS = ("firestore", "legacy")
CHUNKS = {"legacy": ADD_CREDIT.chunk, "firestore": ADD_CREDIT.chunk_firestore or ADD_CREDIT.chunk}
PROFILES = production_latency.PROFILES

WHOSE = {
    "yours": "your input",
    "production": "production's (Google's guidance or bill)",
    "model": "the latency model's (a published measurement)",
    "inference": "the latency model's (an inference: no source measures it)",
    "app": "this app's code",
}


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    whose: str  # a key of WHOSE
    source: str  # a link, a file of this app, or the model's source in words


@dataclass(frozen=True)
class Answer:
    name: str
    label: str
    value: float | None  # None: no such figure (an adaptive counter that never reaches the size asked)
    text: str


@dataclass
class Plan:
    planner: str
    inputs: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    arithmetic: list[str] = field(default_factory=list)

    def figure(self, name: str, value: float, unit: str, whose: str, source: str) -> float:
        """`value`, listed among the plan's figures once however often the arithmetic uses it."""
        figure = Figure(name, value, unit, whose, source)
        if figure not in self.figures:
            self.figures.append(figure)
        return value

    def answer(self, name: str, label: str, value: float | None, text: str) -> float | None:
        self.answers.append(Answer(name, label, value, text))
        return value

    def line(self, text: str) -> None:
        self.arithmetic.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {"planner": self.planner, "inputs": self.inputs,
                "figures": [{"name": f.name, "value": f.value, "unit": f.unit, "whose": f.whose,
                             "whose_label": WHOSE[f.whose], "source": f.source} for f in self.figures],
                "answers": [{"name": a.name, "label": a.label, "value": a.value, "text": a.text}
                            for a in self.answers],
                "arithmetic": self.arithmetic}


# --- the model's round trips -----------------------------------------------------------------------------------------

def round_trip(method: str, profile: str) -> production_latency.RoundTrip:
    """The model's round trip of a Datastore RPC (or "cache") under `profile`."""
    if method == "cache":
        return production_latency.CACHE
    return production_latency.PROFILE_DATASTORE[profile].get(method, production_latency.UNKNOWN_RPC)


def trip_source(method: str, profile: str) -> tuple[str, str]:
    """(whose, source) of a round trip's figure: the model's published measurement, or an inference."""
    if method == "cache":
        source = production_latency.SOURCES["cache call (through the VPC connector)"]
    elif round_trip(method, profile) is production_latency.MULTI_REGION_COMMIT:
        source = production_latency.SOURCES_MULTI_REGION_COMMIT
    else:
        source = production_latency.SOURCES.get(method, production_latency.SOURCES["RunQuery"])
    return ("inference" if "inference" in source else "model"), source


def calls_in_turn(plan: Plan, rpcs: dict[str, int], cache_calls: int, profile: str, what: str) -> tuple[float, float]:
    """(median ms, p99 ms) of `rpcs` and `cache_calls` made one after another, each figure added to `plan`: the
    medians summed (the model's typical wait), and every call at its p99 (a bound on a slow request)."""
    median = p99 = 0.0
    terms = []
    for method, n in [*rpcs.items(), ("cache", cache_calls)]:
        if not n:
            continue
        trip = round_trip(method, profile)
        whose, source = trip_source(method, profile)
        plan.figure(f"{method} round trip, median", trip.median_ms, "ms", whose, source)
        plan.figure(f"{method} round trip, p99", round(trip.p99_ms, 1), "ms", whose, production_latency.TAIL_SOURCE)
        median += n * trip.median_ms
        p99 += n * trip.p99_ms
        terms.append(f"{n} x {method} {trip.median_ms:g} ms (p99 {trip.p99_ms:.1f})")
        if method == "RunAggregationQuery":  # the model adds a wait per entry counted, which no input here says
            plan.figure("an aggregation's wait per 1,000 index entries counted",
                        production_latency.SCAN_MS_PER_1000_ENTRIES, "ms", "inference",
                        production_latency.SOURCES["RunAggregationQuery"])
            terms.append(f"{production_latency.SCAN_MS_PER_1000_ENTRIES:g} ms per 1,000 entries each counts (not "
                         "counted here: at least)")
    plan.line(f"{what}: " + (" + ".join(terms) or "no calls") + f" = {median:.1f} ms at the medians, "
              f"{p99:.1f} ms if each waited its p99")
    return median, p99


def priced(plan: Plan, billed: billing.Billed, what: str) -> float:
    """`billed` priced a million times, with the prices as figures of `plan`."""
    for kind, n in (("reads", billed.reads), ("writes", billed.writes), ("deletes", billed.deletes)):
        if n:
            plan.figure(f"price of 100,000 {kind}", billing.USD_PER_100K[kind], "USD", "production",
                        f"{billing.PRICES_SOURCE} ({billing.PRICES_LOCATION}, read {billing.PRICES_READ_ON})")
    plan.line(f"{what}: {billed.priced()}")
    return billed.usd_per_million()


# --- the planners ----------------------------------------------------------------------------------------------------

def adaptive_growth(shards: int, attempts_per_second: float) -> tuple[int, int, float]:
    """(the adaptive counter's size at or above `shards`, windows of attempts it takes from one shard, seconds at
    `attempts_per_second`) if every window's collisions ask for a doubling (counters/growth.py ContentionWindow: a
    window of min(WINDOW, ATTEMPTS_PER_SHARD x shards) attempts; more collisions grow it faster)."""
    size, windows, attempts = 1, 0, 0
    while size < min(shards, ADAPTIVE_MAX_SHARDS):  # at most log2(ADAPTIVE_MAX_SHARDS) steps
        attempts += min(ContentionWindow.WINDOW, ContentionWindow.ATTEMPTS_PER_SHARD * size)
        size, windows = size * 2, windows + 1
    return min(size, ADAPTIVE_MAX_SHARDS), windows, attempts / attempts_per_second


def plan_counter(writes_per_second: int, peak_seconds: int, backend: str = "firestore",
                 profile: str = "production") -> Plan:
    """A counter written `writes_per_second` at peak for `peak_seconds`: the shards it needs, what an increment and a
    total read cost, and when the adaptive counter would reach that size."""
    plan = Plan("counter", {"writes_per_second": writes_per_second, "peak_seconds": peak_seconds,
                            "backend": backend, "profile": profile})
    plan.figure("peak writes a second", writes_per_second, "writes/s", "yours", "")
    plan.figure("peak lasts", peak_seconds, "s", "yours", "")
    rate = plan.figure("sustained writes a second to one entity", SUSTAINED_WRITES_PER_ENTITY, "writes/s",
                       "production", SUSTAINED_WRITES_SOURCE)
    shards = math.ceil(writes_per_second / rate)
    plan.line(f"shards = ceil({writes_per_second} writes/s / {rate:g} write/s an entity) = {shards}")
    plan.answer("shards", "Shards needed (production's guidance)", shards,
                f"{shards} shards" + ("" if shards <= MAX_SHARDS else
                                      f": more than one counter here may have ({MAX_SHARDS}); split it"))
    plan.figure("most shards a counter may have", MAX_SHARDS, "shards", "app", "counters/models.py MAX_SHARDS")

    rpcs = INCREMENT_RPCS[backend]
    median, p99 = calls_in_turn(plan, rpcs, 0, profile, f"one increment on {backend} ({', '.join(rpcs)})")
    plan.answer("increment_rpcs", "An increment's RPCs", sum(rpcs.values()), plural(sum(rpcs.values()), "RPC"))
    plan.answer("increment_ms", "An increment's time, model median", round(median, 1), f"{median:.1f} ms "
                f"(p99 bound {p99:.1f} ms)")
    if backend == "legacy":
        in_turn = 1000 / median
        plan.line(f"one shard's transactions follow one another: 1000 ms / {median:.1f} ms = {in_turn:.1f} "
                  "increments/s a shard at most under the model; production's guidance is the lower figure")
        plan.answer("model_per_shard", "One shard's increments a second in turn, model", round(in_turn, 1),
                    f"{in_turn:.1f}/s")
    usd = priced(plan, INCREMENT_BILL[backend], "an increment is billed")
    plan.answer("increment_usd_per_million", "An increment, USD a million", round(usd, 2), f"${usd:.2f}")
    peak = writes_per_second * peak_seconds
    peak_usd = usd * peak / 1_000_000
    plan.line(f"the peak: {writes_per_second} x {peak_seconds} s = {peak:,} increments = ${peak_usd:,.2f}")
    plan.answer("peak_usd", "The whole peak's increments, USD", round(peak_usd, 2), f"${peak_usd:,.2f}")

    cached_median, _ = calls_in_turn(plan, {}, 1, profile, "a total from the cache (one get)")
    read_median, _ = calls_in_turn(plan, {"Lookup": 1}, 1, profile,
                                   f"a total on a miss (get_multi of the {shards} shard keys, then the cache add)")
    read_usd = priced(plan, billing.Billed(reads=shards), f"a total read on a miss ({shards} shards)")
    plan.answer("total_read", "A total read on a cache miss, USD a million", round(read_usd, 2),
                f"{shards} reads, {read_median:.1f} ms, ${read_usd:.2f} a million (from the cache: "
                f"{cached_median:.1f} ms, nothing billed)")

    size, windows, seconds = adaptive_growth(shards, writes_per_second)
    plan.figure("adaptive counter's most shards", ADAPTIVE_MAX_SHARDS, "shards", "app",
                "counters/models.py ADAPTIVE_MAX_SHARDS")
    plan.figure("contention window, attempts", ContentionWindow.WINDOW, "attempts", "app", "counters/growth.py")
    plan.figure("window per shard, attempts", ContentionWindow.ATTEMPTS_PER_SHARD, "attempts", "app",
                "counters/growth.py")
    plan.line(f"adaptive: from 1 shard, doubling after each window of min({ContentionWindow.WINDOW}, "
              f"{ContentionWindow.ATTEMPTS_PER_SHARD} x shards) attempts that collide: {windows} windows to "
              f"{size} shards, {seconds:.1f} s at {writes_per_second} attempts/s (a process's own attempts)")
    text = f"{size} shards after {windows} windows, about {seconds:.1f} s into the peak"
    reached: float | None = round(seconds, 1)
    if shards > ADAPTIVE_MAX_SHARDS:
        text, reached = f"never: it stops at {ADAPTIVE_MAX_SHARDS} shards; give it a general counter of {shards}", None
    elif backend == "firestore":
        text += " (on Firestore its blind increments never collide on the emulator: give it fixed shards)"
    plan.answer("adaptive_seconds", "When the adaptive counter reaches that size, s", reached, text)
    return plan


def front_page_reads(entries: int, page: int = BLOG_PAGE) -> int:
    """Billed reads of the front page rendered from Datastore (a cache miss): the BlogIndex, the page and one entry
    more (fetch PAGE+1), and one Lookup of the shown entries' comment counters, each key billed found or not
    (blog/service.py get_page; bench/results/blog.md's `datastore` front page)."""
    return 1 + page_reads(entries, 0, page)[0] + min(page, entries)


def page_reads(entries: int, depth: int, page: int = BLOG_PAGE) -> tuple[int, int]:
    """(billed reads of a page by index, by offset) `depth` entries below the newest of `entries`. By index: the page
    and one more entry, the next page's marker (fetch PAGE+1), as many as remain. By offset: every skipped entry is
    billed as a read, then the page."""
    left = entries - depth
    return min(page + 1, left), depth + min(page, left)


def plan_blog(entries: int, depth: int, readers_per_second: int, read_budget_per_second: int,
              posts_per_second: int = 1, profile: str = "production") -> Plan:
    """A blog of `entries` read `readers_per_second` on its front page: a page's bill by index and by offset at
    `depth`, the front page's cache hit rate that keeps its reads under `read_budget_per_second`, and the posts a
    second one blog can take in turn."""
    plan = Plan("blog", {"entries": entries, "depth": depth, "readers_per_second": readers_per_second,
                         "read_budget_per_second": read_budget_per_second, "posts_per_second": posts_per_second,
                         "profile": profile})
    for name, value, unit in (("entries", entries, "entries"), ("depth", depth, "entries"),
                              ("front page readers a second", readers_per_second, "views/s"),
                              ("read budget", read_budget_per_second, "reads/s"),
                              ("posts a second", posts_per_second, "posts/s")):
        plan.figure(name, value, unit, "yours", "")
    page = plan.figure("page size", BLOG_PAGE, "entries", "app", "blog/service.py PAGE_SIZE")
    by_index, by_offset = page_reads(entries, depth)
    plan.line(f"by index: min({page:g} + 1, {entries} - {depth}) = {by_index} reads (the page and the next "
              "page's first entry, found by its index)")
    plan.line(f"by offset: {depth} skipped + min({page:g}, {entries} - {depth}) = {by_offset} reads (production "
              "bills every entity an offset skips)")
    index_usd = priced(plan, billing.Billed(reads=by_index), "a page by index")
    offset_usd = priced(plan, billing.Billed(reads=by_offset), "a page by offset")
    plan.answer("index_reads", "A page by index, billed reads", by_index,
                f"{by_index} reads, ${index_usd:.2f} a million")
    plan.answer("offset_reads", "A page by offset, billed reads", by_offset,
                f"{by_offset} reads, ${offset_usd:.2f} a million ({by_offset / by_index:.0f}x)")

    front = front_page_reads(entries)
    plan.line(f"a front page rendered on a miss: 1 BlogIndex + {page_reads(entries, 0)[0]} entries + "
              f"{min(BLOG_PAGE, entries)} comment counters (one Lookup) = {front} reads")
    misses = min(1.0, read_budget_per_second / (front * readers_per_second))
    plan.line(f"front page: {readers_per_second} views/s x {front} reads a miss x (1 - hit rate) <= "
              f"{read_budget_per_second} reads/s, so hit rate >= 1 - {read_budget_per_second} / "
              f"({front} x {readers_per_second}) = {1 - misses:.4f}")
    plan.answer("hit_rate", "Front page cache hit rate needed", round(1 - misses, 4), f"{(1 - misses) * 100:.2f}%")

    median, _ = calls_in_turn(plan, TRANSACTION, 0, profile, "a post holds the blog's index entity (its transaction)")
    rate = plan.figure("sustained writes a second to one entity", SUSTAINED_WRITES_PER_ENTITY, "writes/s",
                       "production", SUSTAINED_WRITES_SOURCE)
    in_turn = 1000 / median
    plan.line(f"posts take turns on one index entity: at most 1000 / {median:.1f} = {in_turn:.1f} posts/s under the "
              f"model; production's guidance: {rate:g} a second sustained")
    fits = posts_per_second <= rate
    plan.answer("posts_in_turn", "Posts a second one blog takes in turn", rate,
                f"{rate:g} sustained (production's guidance; {in_turn:.1f} at most under the model): "
                + (f"{posts_per_second}/s fits" if fits else f"{posts_per_second}/s does not: split the blog"))
    plan.answer("post_rpcs", "A post's critical path, RPCs", sum(TRANSACTION.values()),
                f"{sum(TRANSACTION.values())} RPCs in turn")
    return plan


def comment_bills(backend: str) -> tuple[billing.Billed, billing.Billed]:
    """(a designed comment's bill, a shared-sequence comment's): the designed one also counts itself on a shard of
    the entry's counter (an increment on `backend`)."""
    return COMMENT_BILL + INCREMENT_BILL[backend], COMMENT_BILL


def plan_comments(comments_per_second: int, writers: int, backend: str = "firestore",
                  profile: str = "production") -> Plan:
    """`comments_per_second` on one entry from `writers` people: each writer's own group's headroom against one shared
    parent, the entry's counter shards, and each design's bill."""
    plan = Plan("comments", {"comments_per_second": comments_per_second, "writers": writers, "backend": backend,
                             "profile": profile})
    plan.figure("comments a second on one entry", comments_per_second, "comments/s", "yours", "")
    plan.figure("writers", writers, "people", "yours", "")
    rate = plan.figure("sustained writes a second to one entity", SUSTAINED_WRITES_PER_ENTITY, "writes/s",
                       "production", SUSTAINED_WRITES_SOURCE)
    per_writer = comments_per_second / writers
    designed = rate / per_writer
    shared = rate / comments_per_second
    plan.line(f"designed: each writer's own group takes {comments_per_second} / {writers} = {per_writer:.3g} "
              f"comments/s; headroom {rate:g} / {per_writer:.3g} = {designed:.3g}x")
    plan.line(f"shared parent: one entity takes all {comments_per_second} comments/s; headroom {rate:g} / "
              f"{comments_per_second} = {shared:.3g}x")
    plan.answer("designed_headroom", "Per-user groups' headroom", round(designed, 3),
                f"{designed:.3g}x" + (" (fits)" if designed >= 1 else " (each writer too fast for their group)"))
    plan.answer("shared_headroom", "One shared parent's headroom", round(shared, 3),
                f"{shared:.3g}x" + (" (fits)" if shared >= 1 else " (over the guidance: the writers queue)"))
    shards = math.ceil(comments_per_second / rate)
    plan.line(f"the entry's comment counter: ceil({comments_per_second} / {rate:g}) = {shards} shards")
    plan.answer("counter_shards", "The comment counter's shards", shards, f"{shards} shards")
    median, _ = calls_in_turn(plan, TRANSACTION, 0, profile, "a comment's transaction")
    in_turn = 1000 / median
    plan.line(f"shared: comments in turn at most 1000 / {median:.1f} = {in_turn:.1f}/s under the model")
    plan.answer("shared_in_turn", "Shared parent, comments a second in turn (model)", round(in_turn, 1),
                f"{in_turn:.1f}/s")
    designed_bill, shared_bill = comment_bills(backend)
    plan.figure("a comment's own transaction", COMMENT_BILL.reads + COMMENT_BILL.writes, "operations", "app",
                "comments/service.py post_comment: read the sequence, write it and the comment")
    designed_usd = priced(plan, designed_bill, f"a designed comment ({backend}: with its count)")
    shared_usd = priced(plan, shared_bill, "a shared-sequence comment")
    plan.answer("designed_bill", "A designed comment, USD a million", round(designed_usd, 2),
                designed_bill.priced())
    plan.answer("shared_bill", "A shared-sequence comment, USD a million", round(shared_usd, 2), shared_bill.priced())
    return plan


def plan_request(rpcs: dict[str, int], cache_calls: int = 0, reads: int = 0, writes: int = 0, deletes: int = 0,
                 profile: str = "production") -> Plan:
    """A request's RPCs by method and its cache calls, made one after another: its time at the model's medians and
    p99s, and its bill (`reads`, `writes`, `deletes`: what those RPCs bill, as /appstats shows them)."""
    plan = Plan("request", {"rpcs": rpcs, "cache_calls": cache_calls, "reads": reads, "writes": writes,
                            "deletes": deletes, "profile": profile})
    for method, n in sorted(rpcs.items()):
        plan.figure(f"{method} RPCs", n, "RPCs", "yours", "")
    plan.figure("cache calls", cache_calls, "calls", "yours", "")
    median, p99 = calls_in_turn(plan, rpcs, cache_calls, profile, "the calls in turn")
    plan.answer("rpcs", "Datastore RPCs on the critical path", sum(rpcs.values()), plural(sum(rpcs.values()), "RPC"))
    plan.answer("median_ms", "Time waiting, model medians", round(median, 1), f"{median:.1f} ms")
    plan.answer("p99_ms", "Time waiting, every call at its p99", round(p99, 1), f"{p99:.1f} ms")
    billed = billing.Billed(reads=reads, writes=writes, deletes=deletes)
    usd = priced(plan, billed, "its bill")
    plan.answer("usd_per_million", "Billed, USD a million such requests", round(usd, 2), billed.priced())
    return plan


def plan_recorded(request_id: int, profile: str = "production") -> Plan:
    """A request /appstats recorded (read from the shared cache, never from Datastore), as if served in production:
    the calls on its critical path as the request planner's input, and its bill as counted."""
    record, calls = records.kept_request(runtime.current().cache, request_id)
    critical = [calls[i] for i in sorted(costs.critical_path(calls))]
    rpcs = Counter(call.name for call in critical if call.kind == "datastore")
    billed = record["billed"]
    plan = plan_request(dict(rpcs), sum(call.kind == "cache" for call in critical), billed["reads"],
                        billed["writes"], billed["deletes"], profile)
    plan.planner, plan.inputs = "request", {"appstats": request_id, "profile": profile}
    plan.arithmetic.insert(0, f"request {request_id}, {record['method']} {record['path'][:200]}: "
                              f"{plural(len(critical), 'call')} of its {len(calls)} kept on its critical path "
                              "(each made after the one before it was answered), its bill as counted")
    return plan

# --- a batch job over a kind: the mapper's fan-out against one cursor walk and a non-transactional pipeline ---------


@dataclass(frozen=True)
class Tree:
    """The mapper's tree over evenly spread keys, as mapper/tree.py cuts it (each range task lists its page and
    `fanout` pages more, hands those out whole, and splits what lies beyond into up to `fanout` ranges)."""
    tasks: int
    range_tasks: int  # tasks that list their range (a keys-only query each)
    handing: int  # range tasks that handed pages out (each keeps them in a HandedPages entity)
    depth: int
    transactions: int  # chunks, each one transaction with the task's record
    path_rpcs: int  # the longest chain of RPCs: each level's listing and first transaction, then a whole page


def transactions_for(entities: int, chunk: int) -> int:
    """A page's transactions: one a chunk, and an empty page still one (its record)."""
    return max(1, math.ceil(entities / chunk))


def fan_out(entities: int, page: int, fanout: int, chunk: int) -> Tree:
    """The tree over `entities`, from the shape of mapper/tree.py's _split (exact for evenly spread keys; on legacy
    the ranges are cut at __scatter__ samples, which are not even). Memoised by range size: the ranges of one level
    differ by one entity at most, so a tree of 10**10 entities is a few dozen distinct sizes."""
    listed_most = page * (fanout + 1)
    txn = sum(TRANSACTION.values())

    def page_task(n: int) -> Tree:
        t = transactions_for(n, chunk)
        return Tree(1, 0, 0, 1, t, txn * t)

    @functools.cache
    def range_task(n: int) -> Tree:
        own = min(page, n)
        handed_keys = min(n - own, page * fanout)
        handed = [page] * (handed_keys // page) + ([handed_keys % page] if handed_keys % page else [])
        rest = n - own - handed_keys
        children = [page_task(size) for size in handed]
        if rest:
            parts = max(1, min(fanout, math.ceil(2 * rest / listed_most)))
            children += [range_task(rest // parts + (i < rest % parts)) for i in range(parts)]
        t = transactions_for(own, chunk)
        # Its children start once its listing and its first chunk's transaction are done.
        path = max([1 + txn * t] + [1 + txn + c.path_rpcs for c in children])
        return Tree(1 + sum(c.tasks for c in children), 1 + sum(c.range_tasks for c in children),
                    (1 if handed else 0) + sum(c.handing for c in children),
                    1 + max((c.depth for c in children), default=0),
                    t + sum(c.transactions for c in children), path)

    return range_task(entities)


def walk_critical_path(entities: int, page: int, chunk: int, backend: str) -> tuple[int, int]:
    """(RPCs of one cursor walk, all in turn; its queries): a keys-only query a page, and a transaction of 3 RPCs a
    chunk. The legacy emulator answers a full last page "maybe more", so there the walk asks once more (an empty
    page); Firestore's says it was the last."""
    full, left = divmod(entities, page)
    queries = math.ceil(entities / page) + (1 if backend == "legacy" and not left else 0)
    transactions = full * math.ceil(page / chunk) + math.ceil(left / chunk)
    return queries + sum(TRANSACTION.values()) * transactions, queries


def plan_batch(entities: int, page_size: int, fanout: int, instances: int, backend: str = "firestore",
               profile: str = "production") -> Plan:
    """A job visiting `entities` of a kind (add_credit's chunks) in pages of `page_size`: the mapper's tree (depth,
    tasks, critical path, wall time with `instances` tasks at once, bill) against one cursor walk and a
    non-transactional batch pipeline."""
    plan = Plan("batch", {"entities": entities, "page_size": page_size, "fanout": fanout, "instances": instances,
                          "backend": backend, "profile": profile})
    for name, value, unit in (("entities", entities, "entities"), ("page size", page_size, "entities"),
                              ("fan-out", fanout, "ranges"), ("tasks at once", instances, "tasks")):
        plan.figure(name, value, unit, "yours", "")
    chunk = plan.figure("entities a transaction", CHUNKS[backend], "entities", "app",
                        f"accounts/credit.py CREDIT_CHUNK: legacy's {MAX_GROUPS} entity groups a transaction, less "
                        "the task's record" if backend == "legacy" else "accounts/credit.py ACCOUNTS_CHUNK_FIRESTORE")
    chunk = int(chunk)
    tree = fan_out(entities, page_size, fanout, chunk)
    plan.line(f"the tree: each range task lists its page and {fanout} pages more, hands those out and splits the "
              f"rest {fanout} ways: {tree.tasks} tasks ({tree.range_tasks} listing a range), depth {tree.depth} "
              f"(if the {fanout * page_size} keys handed out fit a task's {HANDED_BYTES:,} bytes, mapper/handoff.py; "
              "fewer pages handed out make a deeper tree)")
    plan.answer("depth", "Fan-out: tree depth", tree.depth, str(tree.depth))
    plan.answer("tasks", "Fan-out: tasks", tree.tasks, str(tree.tasks))
    plan.line(f"its critical path: {tree.depth - 1} levels x (1 listing + 3 for the first transaction) + the last "
              f"page's transactions = {tree.path_rpcs} RPCs (the job's own reads and its end are not counted)")
    plan.answer("critical_rpcs", "Fan-out: critical path, RPCs (at least)", tree.path_rpcs, f"{tree.path_rpcs} RPCs")

    median_ms = {m: round_trip(m, profile).median_ms for m in ("RunQuery", *TRANSACTION)}
    txn_ms = sum(median_ms[m] for m in TRANSACTION)
    hop_ms = production_latency.TASK_CREATE.median_ms + production_latency.TASK_DELIVERY.median_ms
    for name, trip in (("Cloud Tasks create", production_latency.TASK_CREATE),
                       ("Cloud Tasks delivery", production_latency.TASK_DELIVERY)):
        plan.figure(name, trip.median_ms, "ms", "inference", production_latency.SOURCES[name])
    calls_in_turn(plan, {"RunQuery": 1, **TRANSACTION}, 0, profile, "a listing and a transaction")
    path_ms = (tree.depth - 1) * (median_ms["RunQuery"] + txn_ms + hop_ms) + (
        tree.path_rpcs - (tree.depth - 1) * 4) / 3 * txn_ms
    work_ms = tree.range_tasks * median_ms["RunQuery"] + tree.transactions * txn_ms + tree.tasks * hop_ms
    wall_s = max(path_ms, work_ms / instances) / 1000
    plan.line(f"its wall time: the longer of the critical path ({path_ms / 1000:.2f} s with each task's create and "
              f"delivery) and all the work ({work_ms / 1000:.1f} s) over {instances} tasks at once = {wall_s:.2f} s")
    plan.answer("wall_s", "Fan-out: wall time, model medians, s", round(wall_s, 2), f"{wall_s:.2f} s")

    fan_bill = billing.Billed(reads=entities + tree.transactions + tree.range_tasks + tree.tasks,
                              writes=entities + tree.transactions + tree.handing)
    plan.line(f"its bill: reads = {entities} entities + {tree.transactions} record reads (one a transaction) + "
              f"{tree.range_tasks} listings + {tree.tasks} records summed at the end; writes = {entities} + "
              f"{tree.transactions} records + {tree.handing} handed-out pages")
    usd = priced(plan, fan_bill, "the fan-out is billed")
    plan.answer("fan_out_bill", "Fan-out: billed, USD a job", round(usd / 1_000_000, 4),
                f"{fan_bill.describe()}: ${usd / 1_000_000:.4f} a job")

    walk, queries = walk_critical_path(entities, page_size, chunk, backend)
    walk_ms = queries * median_ms["RunQuery"] + (walk - queries) / 3 * txn_ms
    plan.line(f"one cursor walk: {queries} page queries + 3 x {(walk - queries) // 3} transactions = {walk} RPCs in "
              f"turn, {walk_ms / 1000:.1f} s at the model's medians")
    plan.answer("walk_rpcs", "One cursor walk: critical path, RPCs", walk, f"{walk} RPCs, {walk_ms / 1000:.1f} s")
    walk_bill = billing.Billed(reads=entities + queries, writes=entities)
    usd = priced(plan, walk_bill, "the walk is billed (a keys-only page query is one read)")
    plan.answer("walk_bill", "One cursor walk: billed, USD a job", round(usd / 1_000_000, 4),
                f"{walk_bill.describe()}: ${usd / 1_000_000:.4f} a job")

    pipeline = billing.Billed(reads=entities, writes=entities)
    usd = priced(plan, pipeline, "a batch pipeline (every entity read, then written in batches, no transaction)")
    plan.answer("pipeline_bill", "Batch pipeline: billed, USD a job", round(usd / 1_000_000, 4),
                f"{pipeline.describe()}: ${usd / 1_000_000:.4f} a job")
    twice = entities // 2
    plan.line(f"the pipeline failing half way and run again credits what it had written twice: {entities} / 2 = "
              f"{twice} at least (workers in flight write more); the fan-out resumes each task from its record")
    plan.answer("pipeline_twice", "Batch pipeline failing half way: entities credited twice", twice,
                f"{twice} at least; the fan-out none")
    return plan


# --- the planners' inputs: one bound for every number, so no input makes a planner loop or allocate much -------------

@dataclass(frozen=True)
class Number:
    name: str
    label: str
    low: int
    high: int
    default: int | None = None  # None: required


@dataclass(frozen=True)
class Choice:
    name: str
    label: str
    options: tuple[str, ...]


@dataclass(frozen=True)
class Planner:
    name: str
    title: str
    question: str
    numbers: tuple[Number, ...]
    choices: tuple[Choice, ...]
    example: dict[str, Any]  # what its form shows first: the lesson's worked example (docs/lessons/numbers.md)
    rpcs: bool = False  # takes {"rpcs": {method: count}}


BACKEND = Choice("backend", "Backend", BACKENDS)
PROFILE = Choice("profile", "Latency profile", PROFILES)
RPC_METHODS = tuple(production_latency.DATASTORE)
MOST_RPCS = 1000
MOST_REQUEST_ID = 2**63 - 1  # Appstats numbers requests from the time in microseconds (appstats/records.py)
PLANNERS = {p.name: p for p in (
    Planner("counter", "A counter", "How many shards, and what does each increment and total cost?",
            (Number("writes_per_second", "Writes a second at peak", 1, 1_000_000),
             Number("peak_seconds", "How long the peak lasts, s", 1, 604_800)), (BACKEND, PROFILE),
            {"writes_per_second": 50, "peak_seconds": 600}),
    Planner("blog", "A blog or feed", "What does a page cost by index and by offset, and how well must the front "
            "page cache?",
            (Number("entries", "Entries", 1, 10**10), Number("depth", "Depth of the page read, entries", 0, 10**10),
             Number("readers_per_second", "Front page views a second", 1, 10**7),
             Number("read_budget_per_second", "Read budget, reads a second", 1, 10**9),
             Number("posts_per_second", "Posts a second", 0, 1_000_000, default=1)), (PROFILE,),
            {"entries": 10_000, "depth": 5_000, "readers_per_second": 100, "read_budget_per_second": 50}),
    Planner("comments", "Comments on one entry", "Per-user groups or one shared parent?",
            (Number("comments_per_second", "Comments a second on one entry", 1, 1_000_000),
             Number("writers", "People writing them", 1, 10**9)), (BACKEND, PROFILE),
            {"comments_per_second": 20, "writers": 200}),
    Planner("request", "A request", "How long does it wait, and what is it billed, as if served in production?",
            (Number("cache_calls", "Cache calls", 0, MOST_RPCS, default=0),
             Number("reads", "Billed reads", 0, 10**9, default=0),
             Number("writes", "Billed writes", 0, 10**9, default=0),
             Number("deletes", "Billed deletes", 0, 10**9, default=0)), (PROFILE,),
            {"rpcs": {"RunQuery": 1}, "cache_calls": 2, "reads": 11}, rpcs=True),
    Planner("batch", "A batch job over a kind", "The mapper's fan-out, one cursor walk, or a batch pipeline?",
            (Number("entities", "Entities", 1, 10**10), Number("page_size", "Page size", 1, MAX_PAGE_SIZE,
                                                                 default=ADD_CREDIT.page_size),
             Number("fanout", "Fan-out", MIN_FANOUT, MAX_FANOUT, default=ADD_CREDIT.fanout),
             Number("instances", "Tasks at once", 1, 100_000, default=8)), (BACKEND, PROFILE),
            {"entities": 10_000}),
)}
# The request planner's other input, {"appstats": id}: a request /appstats recorded (admins only, as /appstats is).
RECORDED = Planner("recorded", "A recorded request", "", (), (PROFILE,), {})
FUNCTIONS: dict[str, Callable[..., Plan]] = {
    "counter": plan_counter, "blog": plan_blog, "comments": plan_comments, "request": plan_request,
    "batch": plan_batch, "recorded": plan_recorded}


def _rpcs(value: object) -> dict[str, int]:
    if not isinstance(value, dict):
        raise Unprocessable("rpcs must be an object of RPC counts by method, e.g. {\"Lookup\": 1}.", "bad_rpcs")
    unknown = sorted(set(value) - set(RPC_METHODS))
    if unknown:
        raise Unprocessable(f"rpcs takes the methods {', '.join(RPC_METHODS)}; not {', '.join(unknown)[:200]}.",
                            "bad_rpcs")
    return {method: whole_number(value[method], "rpcs", 0, MOST_RPCS, from_json=True) for method in value}


def checked_inputs(planner: object, inputs: object) -> tuple[Planner, dict[str, Any]]:
    """The planner `planner` names and its inputs as its function takes them; a 422 naming what is wrong."""
    if not isinstance(planner, str) or planner not in PLANNERS:
        raise Unprocessable(f"planner must be one of {', '.join(PLANNERS)}.", "bad_planner")
    spec = PLANNERS[planner]
    if not isinstance(inputs, dict):
        raise Unprocessable("inputs must be an object.", "bad_inputs")
    known = {n.name for n in spec.numbers} | {c.name for c in spec.choices} | ({"rpcs"} if spec.rpcs else set())
    if spec.rpcs and "appstats" in inputs:
        known = {"appstats", *(c.name for c in spec.choices)}  # the record says the rest
    unknown = sorted(set(inputs) - known)
    if unknown:
        raise Unprocessable(f"The {planner} planner takes {', '.join(sorted(known))}; not {', '.join(unknown)[:200]}.",
                            "bad_inputs")
    args: dict[str, Any] = {}
    for number in spec.numbers:
        if number.name not in inputs and number.default is not None:
            args[number.name] = number.default
        else:  # absent and required, or present (null included: the document says a number)
            args[number.name] = whole_number(inputs.get(number.name), number.name, number.low, number.high,
                                             from_json=True)
    for choice in spec.choices:
        value = inputs.get(choice.name, choice.options[0])
        if not isinstance(value, str) or value not in choice.options:
            raise Unprocessable(f"{choice.name} must be one of {', '.join(choice.options)}.", f"bad_{choice.name}")
        args[choice.name] = value
    if spec.rpcs and "appstats" in inputs:  # a recorded request: its calls and bill come from its record
        return RECORDED, {"request_id": whole_number(inputs["appstats"], "appstats", 1, MOST_REQUEST_ID,
                                                                 from_json=True), "profile": args["profile"]}
    if spec.rpcs:
        args["rpcs"] = _rpcs(inputs.get("rpcs", {}))
    if planner == "blog" and args["depth"] >= args["entries"]:
        raise Unprocessable("depth must be less than entries: the page read starts that many below the newest.",
                            "bad_depth")
    return spec, args


def plan(planner: object, inputs: object) -> dict[str, Any]:
    """The answer of the planner `planner` names to `inputs` (checked first: 422 naming what is wrong). Writes
    nothing; reads nothing but a recorded request's record, from the shared cache."""
    spec, args = checked_inputs(planner, inputs)
    return FUNCTIONS[spec.name](**args).as_dict()
