"""Benchmark: the blog's two claims, each measured side by side in one run.

1. Paging by index costs the same at any depth; paging by offset grows with it. A blog of 10,000 entries; the page at
   depth 0, 1,000, 5,000 and 9,990 fetched by `index <= start ORDER BY index DESC` (blog.service.query_page, what
   the app runs) and by `ORDER BY index DESC` with `fetch(10, offset=depth)`. Each fetch in a fresh ndb context.
2. The cached front page against the same page rendered from Datastore, through the HTTP server (gunicorn, as
   App Engine runs it): two servers on the same emulator, one with memcached and one without, loaded in turn by the
   same client threads. Requests per second and latency.

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
    times = {(m, d): [] for m in METHODS for d in DEPTHS}
    for method in METHODS.values():  # warm up the emulator's JIT and the connection before anything is timed
        for depth in DEPTHS:
            harness.in_context(method)(depth)
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
    return {key: harness.median(v) for key, v in times.items()}


def load(port, path, seconds, expect):
    """CLIENTS threads GET `path` for `seconds` on keep-alive connections; (requests/s, latencies, failures)."""
    latencies, failures, lock = [], [0], threading.Lock()
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
    return len(latencies) / (time.perf_counter() - start), latencies, failures[0]


def measure_front_page(stack, rounds, seconds):
    base = dict(stack.env(), SECRET_KEY="bench", LOG_LEVEL="WARNING")
    servers = {"memcache": Gunicorn(base), "datastore": Gunicorn(dict(base, MEMCACHED_HOSTS="", REDIS_URL=""))}
    path, expect = f"/blog/{BLOG}", f"Entry {ENTRIES - 1}<".encode()
    results = {name: [] for name in servers}
    try:
        for server in servers.values():  # warm both: imports, connections, the cached page
            load(server.port, path, 1.0, expect)
        for r in range(rounds):
            for name in (list(servers) if r % 2 == 0 else list(reversed(servers))):
                rate, latencies, failures = load(servers[name].port, path, seconds, expect)
                results[name].append((rate, harness.percentile(latencies, 50), harness.percentile(latencies, 99),
                                      failures))
                print(f"round {r + 1} front page from {name:>9}: {rate:7.1f} req/s, "
                      f"p50 {harness.percentile(latencies, 50) * 1000:6.1f} ms, failures {failures}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return {name: tuple(harness.median([x[i] for x in runs]) for i in range(3)) + (sum(x[3] for x in runs),)
            for name, runs in results.items()}


def _section(backend, paging, front, seconds):
    rows = [[d, f"{paging[('index', d)] * 1000:.2f}", f"{paging[('offset', d)] * 1000:.2f}",
             f"{paging[('offset', d)] / paging[('index', d)]:.1f}x"] for d in DEPTHS]
    deep = DEPTHS[-1]
    index_ratio = paging[("index", deep)] / paging[("index", 0)]
    offset_ratio = paging[("offset", deep)] / paging[("offset", 0)]
    speedup = front["memcache"][0] / front["datastore"][0]
    checks = [
        (f"{backend}: index paging, depth {deep} / depth 0", index_ratio, "<= 1.5", index_ratio <= 1.5),
        (f"{backend}: offset paging, depth {deep} / depth 0", offset_ratio, "grows with depth (reported)",
         offset_ratio > paging[("offset", DEPTHS[1])] / paging[("offset", 0)] > 1),
        (f"{backend}: front page req/s, memcache / rendered from Datastore", speedup, ">= 5", speedup >= 5),
        (f"{backend}: failed front page requests", sum(f[3] for f in front.values()), "0",
         all(f[3] == 0 for f in front.values())),
    ]
    front_rows = [[name, f"{rate:.1f}", f"{p50 * 1000:.1f}", f"{p99 * 1000:.1f}", failures]
                  for name, (rate, p50, p99, failures) in front.items()]
    text = f"""## {harness.BACKEND_NAMES[backend]}

Paging a blog of {ENTRIES:,} entries, {PAGE} per page: median time to fetch the page at each depth, {FETCHES} fetches
per depth, method and round, each in a fresh ndb context.

{harness.markdown_table(["depth", "by index ms", "by offset ms", "offset / index"], rows)}

The front page through gunicorn (2 workers x 8 threads), {CLIENTS} keep-alive clients, {seconds} s per run:

{harness.markdown_table(["front page", "requests/s", "p50 ms", "p99 ms", "failed"], front_rows)}
"""
    return text, checks


def report(args, measured):
    sections, checks = [], []
    for backend, (paging, front) in measured.items():
        text, backend_checks = _section(backend, paging, front, args.seconds)
        sections.append(text)
        checks += backend_checks
    harness.bar_chart("blog", list(measured), ("index, depth 0", f"index, depth {DEPTHS[-1]:,}",
                                               "offset, depth 0", f"offset, depth {DEPTHS[-1]:,}"),
                      {(b, f"{method}, depth {d:,}"): measured[b][0][(method, d)] * 1000 for b in measured
                       for method in ("index", "offset") for d in (0, DEPTHS[-1])},
                      "ms to fetch a page (log; lower is better)", log=True)
    text = f"""# Blog benchmark

{harness.machine_line(list(measured))}. {args.rounds} rounds, methods side by side in each round (order alternating);
medians. `memcache`: the app as deployed (the page's entries from memcached, the BlogIndex from ndb's global cache).
`datastore`: the same app with no memcached configured, so every request reads the BlogIndex and queries the entries.

{chr(10).join(sections)}"""
    return harness.publish("blog", text, [harness.target(*check) for check in checks])


def measure(args, stack, app):
    started = time.perf_counter()
    harness.in_context(seed)()
    print(f"seeded {ENTRIES} entries in {time.perf_counter() - started:.1f} s", flush=True)
    return measure_paging(args.rounds), measure_front_page(stack, args.rounds, args.seconds)


def main(argv=None):
    return harness.main_per_backend("bench.blog", argv, measure, report)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
