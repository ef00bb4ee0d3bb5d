"""Benchmark: posting to one blog from many writers at once, on both backends in one run.

Every post is a transaction on the blog's index entity (blog.service.post_entry), the one entity all posts to a blog
share, so this is the blog's contended write:
- burst:     20 writers post once each, all at once, to a fresh blog: the indexes must come out exactly 0..19;
- sustained: 8 writers post to one blog for the run's seconds: posts/s and latency.
Within a process the app queues transactions on one entity on a local lock (core.datastore.transact, `hot_key`)
before they reach the datastore: under Firestore's pessimistic locks, transactions that read the index and then
write it otherwise hold each other up until a lock timeout.

Run: `make bench` (all benchmarks) or `.venv/bin/python -m bench.posts [--rounds 3 --seconds 5 --backends both]`.
"""
import concurrent.futures
import sys
import time

from bench import harness
from blog import service

BURST = 20
WRITERS = 8


def _burst(tag):
    """20 posts at once to a fresh blog: (seconds, failures, dense?)."""
    blog = f"burst-{tag}"
    post_entry = harness.in_context(service.post_entry)  # here: the pool's threads have no runtime current

    def post(i):
        try:
            post_entry(blog, f"post {i}", "body", "bench@example.com")
            return True
        except Exception:  # noqa: BLE001 - a failed post is counted, not raised
            return False
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
        done = list(pool.map(post, range(BURST)))
    elapsed = time.perf_counter() - start
    indexes = sorted(e["index"] for e in harness.in_context(service.get_page)(blog, None, BURST * 2).items)
    return elapsed, done.count(False), indexes == list(range(BURST))


def measure(args, stack, app):
    bursts, loads = [], []
    for r in range(args.rounds):
        bursts.append(_burst(f"r{r}"))
        blog, counter = f"steady-r{r}", iter(range(10 ** 9))
        harness.in_context(service.post_entry)(blog, "first", "body", "bench@example.com")
        loads.append(harness.run_writers(WRITERS, lambda w, blog=blog, counter=counter: service.post_entry(
            blog, f"post {next(counter)}", "body", "bench@example.com") and None, args.seconds))
        page = harness.in_context(service.get_blog)(blog)
        dense = page.max_index + 1 == 1 + loads[-1].commits
        print(f"round {r + 1}: burst of {BURST} in {bursts[-1][0]:.2f} s (failed {bursts[-1][1]}, dense "
              f"{bursts[-1][2]}); sustained {loads[-1].per_second:.1f} posts/s, p99 {loads[-1].pct(99) * 1000:.0f} ms, "
              f"dense {dense}", flush=True)
        bursts[-1] = bursts[-1] + (dense,)
    return bursts, loads


def report(args, measured):
    rows, checks = [], []
    harness.bar_chart("posts", list(measured), ("burst of 20", "sustained, 8 writers"),
                      {**{(b, "burst of 20"): BURST / harness.median([x[0] for x in m[0]])
                          for b, m in measured.items()},
                       **{(b, "sustained, 8 writers"): harness.median([x.per_second for x in m[1]])
                          for b, m in measured.items()}}, "posts/s to one blog (higher is better)")
    for backend, (bursts, loads) in measured.items():
        burst_s = harness.median([b[0] for b in bursts])
        rows.append([harness.BACKEND_NAMES[backend], f"{burst_s:.2f}", f"{BURST / burst_s:.1f}",
                     sum(b[1] for b in bursts), "yes" if all(b[2] for b in bursts) else "**no**",
                     f"{harness.median([x.per_second for x in loads]):.1f}",
                     f"{harness.median([x.pct(50) for x in loads]) * 1000:.1f}",
                     f"{harness.median([x.pct(99) for x in loads]) * 1000:.1f}", sum(x.errors for x in loads),
                     "yes" if all(b[3] for b in bursts) else "**no**"])
        dense = all(b[2] and not b[1] for b in bursts)
        checks.append(harness.target(f"{backend}: 20 concurrent posts give indexes 0..19, every round",
                                     "yes" if dense else "no", "yes", dense))
    text = f"""# Posting benchmark

{harness.machine_line(list(measured))}. {args.rounds} rounds; in each, {BURST} writers post once each at the same
moment to a fresh blog (burst), then {WRITERS} writers post to one blog for {args.seconds} s (sustained). Medians over
the rounds; failures and errors summed. `dense`: the indexes are exactly 0..n-1.

{harness.markdown_table(["backend", "burst: s for 20", "burst posts/s", "burst failures", "burst dense",
                         "sustained posts/s", "p50 ms", "p99 ms", "errors", "sustained dense"], rows)}
"""
    return harness.publish("posts", text, checks)


def main(argv=None):
    return harness.main_per_backend("bench.posts", argv, measure, report, seconds=5.0)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
