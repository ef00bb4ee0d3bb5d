"""Benchmark: what a request costs around its work, against the framework's own ceiling.

A bare Flask view (a 4.4 KB page, nothing else), the floor (a bare Flask view returning the front page's bytes read
from the same cache server in one `get`: the least a cached page can cost) and the app's cheapest pages, served by
one gunicorn (App Engine's entrypoint, 2 workers x 8 threads) in the same process, so that the only difference is the
app's own per-request work: the runtime and ndb context, the session, the security headers, the accounting
(core/costs.py), the page's cache reads and its template. A second gunicorn serves the same app with APPSTATS=off,
to price the accounting alone.
Load from wrk (Debian's, a C client: it takes far less CPU than a Python one on this 2-core machine), 8 keep-alive
connections, the variants one after another in each round; medians over rounds.

Targets (issue 25): the cached front page >= 0.8 of the floor's requests/s and >= 0.35 of the bare view's; the front
page with the accounting on >= 0.97 of it off.

Run: `.venv/bin/python -m bench.overhead [--rounds 5 --seconds 5]` (legacy emulator unless DATASTORE says otherwise).
"""
import argparse
import os
import re
import subprocess
import sys

import requests
from flask import Flask

from bench import harness
from devstack import Stack
from devstack.services import REPO, backend_from_env, debian_binary
from devstack.serving import Gunicorn, app_env, wait_until

CONNECTIONS = 8
BARE_PATH = "/__bare"
BARE_BODY = "<!doctype html><title>bare</title>" + "<p>" + "x" * 4380 + "</p>"  # 4.4 KB, like a page
FLOOR_PATH, FLOOR_KEY = "/__floor", "bench-overhead-floor-page"
FRONT_TARGET, FLOOR_TARGET, ACCOUNTING_TARGET = 0.35, 0.8, 0.97


def served():
    """gunicorn's app (`bench.overhead:served()`): the real app, and beside it in the same process two bare Flask views
    (so all share the workers, the threads and the machine): BARE_PATH answers a fixed string, FLOOR_PATH the front
    page's bytes read from the app's own cache server in one `get` (the least a cached page can cost here: one round
    trip, no Datastore, no template). The floor's copy of the page is the page a visitor gets, taken once."""
    from core import runtime
    from main import create_app
    real = create_app()
    client = runtime.of(real).cache_client  # the raw memcached or Redis client: nothing counted, nothing wrapped
    bare = Flask("bare")
    bare.add_url_rule(BARE_PATH, "bare", lambda: BARE_BODY)

    def floor():
        page = client.get(FLOOR_KEY)
        if page is None:
            page = real.test_client().get("/blog/demo").get_data()
            client.add(FLOOR_KEY, page, 0)
        return page
    bare.add_url_rule(FLOOR_PATH, "floor", floor)

    def app(environ, start_response):
        target = bare if environ.get("PATH_INFO") in (BARE_PATH, FLOOR_PATH) else real
        return target(environ, start_response)
    return app


def wrk(url, seconds):
    """Requests/s wrk sustained on `url` over CONNECTIONS keep-alive connections; a non-2xx answer is an error."""
    out = subprocess.run([WRK, "-t", "1", "-c", str(CONNECTIONS), "-d", f"{seconds}s", url], capture_output=True,
                         text=True, check=True, timeout=seconds + 30).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk {url}: errors\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])


def start_server(stack, env, appstats):
    # its log lines (one a request: part of what the accounting costs) are written, then dropped
    server = Gunicorn(dict(env, APPSTATS=appstats), app="bench.overhead:served()", output=subprocess.DEVNULL)
    wait_until(lambda: requests.get(server.url + "/healthz", timeout=5).ok, "the app answers", timeout=60)
    return server


def main(argv=None):
    global WRK
    parser = argparse.ArgumentParser(prog="python -m bench.overhead")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args(argv)
    WRK = debian_binary("wrk", "wrk")
    stack = Stack(consistency=1.0, backend=backend_from_env()).start()
    servers = []
    try:
        env = app_env(stack, "bench-overhead", admins="")
        subprocess.run([sys.executable, "-m", "flask", "seed"], env=dict(os.environ, **env), cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)
        on, off = start_server(stack, env, "on"), start_server(stack, env, "off")
        servers += [on, off]
        variants = {"bare Flask view": on.url + BARE_PATH, "floor: one cache get": on.url + FLOOR_PATH,
                    "/blog/demo (cached front page)": on.url + "/blog/demo",
                    "/healthz": on.url + "/healthz", "/blog/demo, APPSTATS=off": off.url + "/blog/demo"}
        for url in variants.values():  # warm: templates compiled, caches filled, connections pooled
            wrk(url, 1)
        # what production would bill one warm request of each (the bare view and APPSTATS=off say nothing)
        bills = {name: requests.get(url, timeout=10).headers.get("Server-Timing") for name, url in variants.items()}
        rates = {name: [] for name in variants}
        for r in range(args.rounds):
            for name, url in variants.items():
                rates[name].append(wrk(url, args.seconds))
            print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.0f}/s" for n, v in rates.items()), flush=True)
        return report(args, rates, stack.backend, bills)
    finally:
        for server in servers:
            server.stop()
        stack.stop()


def report(args, rates, backend, bills):
    medians = {name: harness.median(v) for name, v in rates.items()}
    bare = medians["bare Flask view"]
    rows = [[name, f"{m:.0f}", f"{min(rates[name]):.0f}-{max(rates[name]):.0f}", f"{m / bare:.2f}",
             harness.bill_cell_of(bills[name])]
            for name, m in medians.items()]
    # each round's ratio, so a slow spell of the shared machine weighs on both sides alike
    front = harness.median([f / b for f, b in zip(rates["/blog/demo (cached front page)"], rates["bare Flask view"],
                                                  strict=True)])
    floor = harness.median([f / b for f, b in zip(rates["/blog/demo (cached front page)"],
                                                  rates["floor: one cache get"], strict=True)])
    accounting = harness.median([a / b for a, b in zip(rates["/blog/demo (cached front page)"],
                                                       rates["/blog/demo, APPSTATS=off"], strict=True)])
    text = f"""# Per-request overhead: the app's cheapest pages against a bare Flask view

{harness.machine_line([backend])}. gunicorn 2 workers x 8 threads serving the app and a bare Flask view (a 4.4 KB
string) in the same process; a second gunicorn serves the app with APPSTATS=off. wrk, {CONNECTIONS} keep-alive
connections, {args.seconds:g} s per variant, the variants one after another in each of {args.rounds} rounds; medians.
A visitor (no session cookie), the demo content of `flask seed`, every cache warm.

{harness.markdown_table(["variant", "requests/s (median)", "range", "of the bare view", "billed per request"], rows)}

{harness.BILL_NOTE}
"""
    return harness.publish("overhead", text, [
        harness.target("cached front page / floor (one cache get), requests/s (median of the rounds' ratios)", floor,
                       f">= {FLOOR_TARGET}", floor >= FLOOR_TARGET),
        harness.target("cached front page / bare Flask view, requests/s (median of the rounds' ratios)", front,
                       f">= {FRONT_TARGET}", front >= FRONT_TARGET),
        harness.target("front page with the accounting on / off", accounting, f">= {ACCOUNTING_TARGET}",
                       accounting >= ACCOUNTING_TARGET),
    ])


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
