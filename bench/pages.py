"""Benchmark: every page answers in under 200 ms (median) under `make run`'s set-up.

The stack as `make run` starts it (the emulator at consistency 0.9, memcached, the demo content of `flask seed`,
gunicorn with two workers of eight threads, devstack's local Cloud Tasks), one add_credit job run to the end so that the
job pages have one to show. Each page is then fetched one request at a time, by a visitor and by a signed-in admin
(whose pages carry the admin forms), a few warm-up requests first, then `--requests` per round over `--rounds` rounds.

Run: `make bench` (all benchmarks) or `.venv/bin/python -m bench.pages [--rounds 3 --requests 10]`; with
`--url http://127.0.0.1:8080` it measures a running `make run` instead (its data as it is; it runs one job).
"""
import argparse
import os
import re
import subprocess
import sys
import time

import requests

from bench import harness
from devstack import Stack
from devstack.services import REPO, backend_from_env, free_port
from devstack.serving import Gunicorn, app_env, local_tasks, wait_until

TARGET_MS = 200
ADMIN = "bench@example.com"
WARMUP = 3
OWN_STACK = ("A stack of its own, as `make run` starts it: gunicorn 2 workers x 8 threads, the emulator at consistency "
             "0.9, the demo content of `flask seed` (60 entries, 60 comments, 1,000 accounts, 4 counters) and one "
             "finished add_credit job.")
PAGES = ("/", "/counters", "/blog", "/blog/demo", "/blog/demo?start=29", "/blog/demo/{newest}",
         "/blog/demo/{newest}?page=last", "/blog/demo/feed.atom", "/jobs", "/jobs/{job}", "/accounts", "/numbers",
         "/signin", "/source/counters/service.py", "/healthz", "/api/counters", "/api/blogs/demo/entries",
         "/api/blogs/demo/entries/{newest}/comments", "/api/jobs", "/api/jobs/{job}", "/api/accounts/summary",
         "/api/numbers")


COST = re.compile(r'(?P<name>datastore|memcached|redis|cache);desc="(?P<count>\d+) ')


def _timed(session, url, costs=None):
    """Seconds for one GET; its Datastore RPCs and cache calls (its Server-Timing header) go into `costs`."""
    start = time.perf_counter()
    response = session.get(url, timeout=30)
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"GET {url}: {response.status_code}")
    if costs is not None:
        header = response.headers.get("Server-Timing", "")
        found = {m["name"]: int(m["count"]) for m in COST.finditer(header)}
        costs.append((found.get("datastore", 0), sum(n for name, n in found.items() if name != "datastore"),
                      harness.billed_from_header(header)))
    return elapsed


def measure(base, rounds, per_round):
    visitor, admin = requests.Session(), requests.Session()
    admin.post(base + "/api/session", json={"email": ADMIN, "admin": True}).raise_for_status()
    job = admin.post(base + "/api/jobs", json={"name": "add_credit", "params": {"amount": 1}}).json()["id"]
    wait_until(lambda: admin.get(f"{base}/api/jobs/{job}").json()["state"] == "done", "the demo job", timeout=120,
               interval=0.5)
    newest = admin.get(base + "/api/blogs/demo/entries?limit=1").json()["entries"][0]["index"]
    paths = [p.format(job=job, newest=newest) for p in PAGES]
    times = {(p, who): [] for p in paths for who in ("visitor", "admin")}
    costs = {key: [] for key in times}  # (Datastore RPCs, cache calls) of each measured request
    for session in (visitor, admin):
        for path in paths:
            for _ in range(WARMUP):
                _timed(session, base + path)
    for r in range(rounds):
        for path in paths:
            for who, session in (("visitor", visitor), ("admin", admin)):
                times[(path, who)] += [_timed(session, base + path, costs[(path, who)]) for _ in range(per_round)]
        print(f"round {r + 1}: slowest median so far "
              f"{max(harness.median(v) for v in times.values()) * 1000:.1f} ms", flush=True)
    return paths, times, costs


def _cost(costs, which):
    """The median of one figure over the measured requests (a warm cache: each page's steady cost)."""
    return f"{harness.median([c[which] for c in costs]):g}"


def _rows(paths, times, costs):
    """The table's rows for one column, and whether every page met the target there."""
    rows, ok = [], True
    for path in paths:
        medians = {who: harness.median(times[(path, who)]) * 1000 for who in ("visitor", "admin")}
        p90 = max(harness.percentile(times[(path, who)], 90) for who in ("visitor", "admin")) * 1000
        met = max(medians.values()) < TARGET_MS
        ok &= met
        rows.append([f"`{path}`", f"{medians['visitor']:.1f}", f"{medians['admin']:.1f}", f"{p90:.1f}",
                     " / ".join(_cost(costs[(path, who)], 0) for who in ("visitor", "admin")),
                     " / ".join(_cost(costs[(path, who)], 1) for who in ("visitor", "admin")),
                     " / ".join(harness.bill_cell(costs[(path, who)][-1][2]) for who in ("visitor", "admin")),
                     "met" if met else "**missed**"])
    return rows, ok


def report(measured, rounds, per_round, where, backends=None):
    """measured: {column name: (paths, times, costs)}, a table each."""
    tables, ok = [], True
    for name, (paths, times, costs) in measured.items():
        rows, met = _rows(paths, times, costs)
        ok &= met
        tables.append(f"## {name}\n\n" + harness.markdown_table(
            ["page", "visitor median ms", "admin median ms", "p90 ms (worse of the two)",
             "Datastore RPCs, visitor / admin", "cache calls, visitor / admin", "billed per view, visitor / admin",
             f"< {TARGET_MS} ms"], rows))
    newline = "\n\n"
    text = f"""# Pages: every page under {TARGET_MS} ms (median) under `make run`'s set-up

{harness.machine_line(backends)}. {rounds} rounds x {per_round} requests per page and person, one request at a time,
after {WARMUP} warm-up requests. {where}

RPCs and cache calls are each page's own `Server-Timing` figures (core/costs.py), the median over the measured
requests; the bill is the last measured request's (warm). tests/test_budgets.py pins both on a warm cache.
{harness.BILL_NOTE}

{harness.WHOSE_FIGURES}

{newline.join(tables)}
"""
    path = harness.write_result("pages", text)
    print(text)
    print(f"written: {path}")
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.pages")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=10)
    harness.add_latency_argument(parser)  # a stack served under each
    parser.add_argument("--url", help="measure this running app (e.g. make run's) instead of starting one")
    args = parser.parse_args(argv)
    if args.url:
        measured = {f"the app at {args.url}": measure(args.url.rstrip("/"), args.rounds, args.requests)}
        return report(measured, args.rounds, args.requests, f"Measured against a running app at {args.url}.")
    backend = backend_from_env()
    latencies = harness.latencies_named(args.latency)
    measured = {}
    for latency in latencies:
        print(f"--- bench.pages on {backend}, {harness.LATENCY_NAMES[latency]}", flush=True)
        measured[harness.column_name((backend, latency))] = _served(latency, args)
    return report(measured, args.rounds, args.requests, OWN_STACK, [backend])


def _served(latency, args):
    """The pages measured on a stack of their own, served under `latency` (its demo content seeded bare)."""
    stack = Stack(consistency=0.9, backend=backend_from_env()).start()
    server, stack_stops = None, []
    try:
        port = free_port()
        tasks = local_tasks(f"http://127.0.0.1:{port}", "bench-pages").start()
        stack_stops.append(tasks.stop)
        env = app_env(stack, "bench-pages", admins=ADMIN, tasks=tasks, latency="none")
        seeded = time.perf_counter()
        subprocess.run([sys.executable, "-m", "flask", "seed"], env={**os.environ, **env, "LATENCY": "none"},
                       cwd=REPO, check=True)
        print(f"demo content seeded in {time.perf_counter() - seeded:.1f} s", flush=True)
        server = Gunicorn(dict(app_env(stack, "bench-pages", admins=ADMIN, tasks=tasks, latency=latency),
                               LATENCY=latency), port)
        return measure(server.url, args.rounds, args.requests)
    finally:
        if server is not None:
            server.stop()
        for stop in stack_stops:
            stop()
        stack.stop()


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
