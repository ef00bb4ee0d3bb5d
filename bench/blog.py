"""Benchmark: the blog's two claims, each measured side by side in one run.

1. Paging by index costs the same at any depth; paging by offset grows with it. A blog of 10,000 entries; the page at
   depth 0, 1,000, 5,000 and 9,990 fetched by `index <= start ORDER BY index DESC` (blog.service.query_page, what
   the app runs) and by `ORDER BY index DESC` with `fetch(10, offset=depth)`. Each fetch in a fresh ndb context.
2. The cached front page against the same page rendered from Datastore, through the HTTP server (gunicorn, as
   App Engine runs it): two servers on the same emulator, one with memcached and one without, loaded in turn by the
   same client threads. Requests per second and latency.

Both on each backend, under each profile of the production latency model (LATENCY=production and multi-region,
core/production_latency.py: every RPC and cache call waits a modelled round trip), and on the bare emulator with
`--latency none` or `all`.

The 10,000 entries are written in batches (put_multi of entries with their indexes, then the BlogIndex), not one
post_entry transaction each: the benchmark is about reading them, and a post's cost is the counters' subject.

Run: `make bench` (all benchmarks) or `.venv/bin/python -m bench.blog [--rounds 3 --seconds 8]`.
"""
import http.client
import sys
import threading
import time

from google.cloud import ndb

from bench import harness
from blog import service
from blog.markup import render_markdown
from blog.models import BlogEntry, BlogIndex, EntryRef
from core import runtime
from devstack.serving import Gunicorn

BLOG = "bench"
ENTRIES = 10_000
DEPTHS = (0, 1_000, 5_000, 9_990)
FETCHES = 15  # per depth, method and round (an offset fetch at depth 9,990 takes seconds on the emulator)
PAGE = service.PAGE_SIZE
CLIENTS = 8  # concurrent HTTP clients, each on its own keep-alive connection


def seed():
    body = ("A benchmark entry. Pages are found by **index**, not by offset:\n\n"
            "```python\nquery.filter(BlogEntry.index <= start).order(-BlogEntry.index)\n```\n")
    html = render_markdown(body)
    blog_key = ndb.Key(BlogIndex, BLOG)
    for low in range(0, ENTRIES, 500):
        ndb.put_multi([BlogEntry(key=EntryRef(BLOG, i).key, index=i, title=f"Entry {i}", body=body,
                                 body_html=html, author="bench@example.com")
                       for i in range(low, min(low + 500, ENTRIES))], use_global_cache=False)
    BlogIndex(key=blog_key, max_index=ENTRIES - 1).put()


def by_index(depth):
    top = ENTRIES - 1
    entries, next_start = service.query_page(ndb.Key(BlogIndex, BLOG), top - depth, PAGE)
    return [e.index for e in entries], next_start


def by_offset(depth):
    entries = (BlogEntry.query(ancestor=ndb.Key(BlogIndex, BLOG)).order(-BlogEntry.index)
               .fetch(PAGE, offset=depth))
    return [e.index for e in entries], None


METHODS = {"index": by_index, "offset": by_offset}


def measure_paging(rounds):
    """({(method, depth): median seconds}, {(method, depth): Billed}); the bill from the warm-up's fetch, which
    bills what every fetch of it does."""
    times = {(m, d): [] for m in METHODS for d in DEPTHS}
    bills = {}
    for name, method in METHODS.items():  # warm up the emulator's JIT and the connection before anything is timed
        for depth in DEPTHS:
            _, bills[(name, depth)] = harness.billed(harness.in_context(method))(depth)
    for r in range(rounds):
        order = list(METHODS) if r % 2 == 0 else list(reversed(METHODS))
        for depth in DEPTHS:
            for method in order:
                fetch = harness.in_context(METHODS[method])
                expected = list(range(ENTRIES - 1 - depth, ENTRIES - 1 - depth - PAGE, -1))
                samples = []
                for _ in range(FETCHES):
                    start = time.perf_counter()
                    indexes, _ = fetch(depth)
                    samples.append(time.perf_counter() - start)
                    assert indexes == expected, (method, depth, indexes[:3])
                times[(method, depth)].append(harness.median(samples))
                print(f"round {r + 1} {method:>6} depth {depth:>5}: {harness.median(samples) * 1000:7.2f} ms",
                      flush=True)
    return {key: harness.median(v) for key, v in times.items()}, bills


def load(port, path, seconds, expect):
    """CLIENTS threads GET `path` for `seconds` on keep-alive connections; (requests/s, latencies, failures)."""
    latencies, failures, lock, bills = [], [0], threading.Lock(), []
    deadline = time.perf_counter() + seconds

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine, bad = [], 0
        for _ in range(100_000):
            if time.perf_counter() >= deadline:
                break
            start = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200 or expect not in body:
                bad += 1
            elif not bills:
                bills.append(harness.billed_from_header(response.getheader("Server-Timing")))
            mine.append(time.perf_counter() - start)
        conn.close()
        with lock:
            latencies.extend(mine)
            failures[0] += bad

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(latencies) / (time.perf_counter() - start), latencies, failures[0], bills[0] if bills else None


def measure_front_page(stack, rounds, seconds, latency):
    base = dict(stack.env(latency), SECRET_KEY="bench", LOG_LEVEL="WARNING", LATENCY=latency)
    servers = {"memcache": Gunicorn(base), "datastore": Gunicorn(dict(base, MEMCACHED_HOSTS="", REDIS_URL=""))}
    path, expect = f"/blog/{BLOG}", f"Entry {ENTRIES - 1}<".encode()
    results = {name: [] for name in servers}
    bills = {}
    try:
        for server in servers.values():  # warm both: imports, connections, the cached page
            load(server.port, path, 1.0, expect)
        for r in range(rounds):
            for name in (list(servers) if r % 2 == 0 else list(reversed(servers))):
                rate, latencies, failures, bills[name] = load(servers[name].port, path, seconds, expect)
                results[name].append((rate, harness.percentile(latencies, 50), harness.percentile(latencies, 99),
                                      failures))
                print(f"round {r + 1} front page from {name:>9}: {rate:7.1f} req/s, "
                      f"p50 {harness.percentile(latencies, 50) * 1000:6.1f} ms, failures {failures}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return {name: tuple(harness.median([x[i] for x in runs]) for i in range(3)) + (sum(x[3] for x in runs),
                                                                                  bills[name])
            for name, runs in results.items()}


def _section(column, measured, front, seconds):
    backend = harness.column_name(column)
    paging, bills = measured
    rows = [[d, f"{paging[('index', d)] * 1000:.2f}", f"{paging[('offset', d)] * 1000:.2f}",
             f"{paging[('offset', d)] / paging[('index', d)]:.1f}x", harness.bill_cell(bills[("index", d)]),
             harness.bill_cell(bills[("offset", d)]), f"{bills[('offset', d)].reads / bills[('index', d)].reads:.0f}x"]
            for d in DEPTHS]
    deep = DEPTHS[-1]
    index_ratio = paging[("index", deep)] / paging[("index", 0)]
    offset_ratio = paging[("offset", deep)] / paging[("offset", 0)]
    billed_ratio = bills[("offset", deep)].reads / bills[("index", deep)].reads
    checks = [
        (f"{backend}: billed reads, offset page / index page at depth {deep}", billed_ratio, ">= 500",
         billed_ratio >= 500),
        (f"{backend}: index paging, depth {deep} / depth 0", index_ratio, "<= 1.5", index_ratio <= 1.5),
        # In time, only where the emulator shows it: the Firestore emulator skips rows at little visible cost, and
        # there the bill above is the lesson (the times are in the table either way).
        *([(f"{backend}: offset paging time, depth {deep} / depth 0", offset_ratio, "grows with depth",
            offset_ratio > paging[("offset", DEPTHS[1])] / paging[("offset", 0)] > 1)]
          if column[0] == "legacy" else []),
    ]
    speedup = front["memcache"][0] / front["datastore"][0]
    checks += [
        (f"{backend}: front page req/s, memcache / rendered from Datastore", speedup, ">= 5", speedup >= 5),
        (f"{backend}: failed front page requests", sum(f[3] for f in front.values()), "0",
         all(f[3] == 0 for f in front.values())),
    ]
    front_rows = [[name, f"{rate:.1f}", f"{p50 * 1000:.1f}", f"{p99 * 1000:.1f}", failures,
                   harness.bill_cell(bill) if bill else "-"]
                  for name, (rate, p50, p99, failures, bill) in front.items()]
    text = f"""## {backend}

Paging a blog of {ENTRIES:,} entries, {PAGE} per page: median time to fetch the page at each depth, {FETCHES} fetches
per depth, method and round, each in a fresh ndb context.

{harness.markdown_table(["depth", "by index ms", "by offset ms", "offset / index, time", "by index billed",
                         "by offset billed", "offset / index, billed reads"], rows)}

The front page through gunicorn (2 workers x 8 threads), {CLIENTS} keep-alive clients, {seconds} s per run:

{harness.markdown_table(["front page", "requests/s", "p50 ms", "p99 ms", "failed", "billed per view"], front_rows)}
"""
    return text, checks


def report(args, measured):
    sections, checks = [], []
    for column, (paging, front) in measured.items():
        text, backend_checks = _section(column, paging, front, args.seconds)
        sections.append(text)
        checks += backend_checks
    names = {harness.column_name(c): c for c in measured}
    harness.bar_chart("blog", list(names), ("index, depth 0", f"index, depth {DEPTHS[-1]:,}",
                                            "offset, depth 0", f"offset, depth {DEPTHS[-1]:,}"),
                      {(n, f"{method}, depth {d:,}"): measured[c][0][0][(method, d)] * 1000 for n, c in names.items()
                       for method in ("index", "offset") for d in (0, DEPTHS[-1])},
                      "ms to fetch a page (log; lower is better)", log=True)
    machine = harness.machine_line(sorted({b for b, _ in measured}))
    text = f"""# Blog benchmark

{machine}. {args.rounds} rounds, methods side by side in each round (order alternating);
medians. `memcache`: the app as deployed (the page's entries from memcached, the BlogIndex from ndb's global cache).
`datastore`: the same app with no memcached configured, so every request reads the BlogIndex and queries the entries.

{harness.BILL_NOTE} Where the two disagree, the bill decides the lesson: the Firestore emulator skips an offset's
rows at little visible cost in time, but production bills every skipped entity as a read.

{harness.WHOSE_FIGURES}

{chr(10).join(sections)}"""
    return harness.publish("blog", text, [harness.target(*check) for check in checks])


def measure(args, stack, app):
    started = time.perf_counter()
    harness.in_context(seed)()
    print(f"seeded {ENTRIES} entries in {time.perf_counter() - started:.1f} s", flush=True)
    return measure_paging(args.rounds), measure_front_page(stack, args.rounds, args.seconds,
                                                           runtime.of(app).settings.latency)


def main(argv=None):
    return harness.main_per_column("bench.blog", argv, measure, report)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
