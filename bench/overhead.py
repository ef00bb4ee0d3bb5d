"""Benchmark: what a request costs around its work, and what the accounting costs (reported, not a target).

A bare Flask view (a 4.4 KB page, nothing else), the floor (a bare Flask view returning the front page's bytes read
from the same cache server in one `get`: the least a cached page can cost) and the app's cheapest pages, with the
accounting on and off, all served by one gunicorn (App Engine's entrypoint, 2 workers x 8 threads) in the same
processes. The app that counts no costs (Runtime.counting_costs off) is a second app in the same workers, reached
by its own Host name, so that the two share the workers, their threads and the machine's every spell. Load from wrk,
8 keep-alive connections; in each round every variant gets its seconds one at a time, the variants in turn; medians
over rounds of the rounds' ratios.

Then the same front page under each profile of the production latency model, one request at a time, against
the floor under the model: what serving a kept copy ahead of Flask could save a visitor at most.

Run: `.venv/bin/python -m bench.overhead [--rounds 5 --seconds 5]` (legacy emulator unless DATASTORE says otherwise).
"""
import argparse
import contextlib
import dataclasses
import glob
import os
import re
import subprocess
import sys
import time

import requests
from flask import Flask

from bench import harness
from core import production_latency, runtime
from devstack import Stack
from devstack.services import REPO, backend_from_env, debian_binary
from devstack.serving import Gunicorn, app_env, wait_until

CONNECTIONS = 8
BARE_PATH = "/__bare"
BARE_BODY = "<!doctype html><title>bare</title>" + "<p>" + "x" * 4380 + "</p>"  # 4.4 KB, like a page
FLOOR_PATH, FLOOR_KEY = "/__floor", "bench-overhead-floor-page"


FRONT, BARE, FLOOR, OFF = ("/blog/demo (front page, its entries cached)", "bare Flask view", "floor: one cache get",
                            "/blog/demo, costs not counted")


OFF_HOST = "appstats-off.localhost"  # the Host name the app that counts no costs answers to


def on_and_off(settings):
    """The app on `settings`, and the same app with the accounting off."""
    from main import create_app
    off = create_app(dataclasses.replace(settings, trusted_hosts=(*settings.trusted_hosts, OFF_HOST)))  # its Host
    runtime.of(off).counting_costs = False
    return create_app(settings), off


def served():
    """gunicorn's app (`bench.overhead:served()`): the real app, the same app counting no costs (for requests to
    OFF_HOST), and beside them in the same process two bare Flask views (so all share the workers, the threads and the
    machine): BARE_PATH answers a fixed string, FLOOR_PATH the front page's bytes read from the app's own cache server
    in one `get` (the least a cached page can cost here: one round trip, no Datastore, no template). The floor's copy
    of the page is the page a visitor gets, taken once."""
    from core.settings import Settings
    real, off = on_and_off(Settings.from_env())
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
        # the same two lookups for every request, whichever app answers it
        target = bare if environ.get("PATH_INFO") in (BARE_PATH, FLOOR_PATH) else \
            off if environ.get("HTTP_HOST") == OFF_HOST else real
        return target(environ, start_response)
    return app


def wrk(url, seconds, host=None):
    """(requests, seconds) wrk sustained on `url` (with the Host header `host`) over CONNECTIONS keep-alive
    connections; a non-2xx answer is an error."""
    out = subprocess.run([WRK, "-t", "1", "-c", str(CONNECTIONS), "-d", f"{seconds}s",
                          *(["-H", f"Host: {host}"] if host else []), url], capture_output=True,
                         text=True, check=True, timeout=seconds + 30).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk {url}: errors\n{out}")
    done = re.search(r"(\d+) requests in ([\d.]+)(m?s)", out)
    return int(done[1]), float(done[2]) / (1000 if done[3] == "ms" else 1)


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(server):
    """CPU time (user + system) the server's workers have used so far: what a request costs the server, apart from
    the time the machine gives to others (steal, a neighbour's load), which requests/s cannot tell apart."""
    total = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended meanwhile
            continue
        if int(fields[1]) == server.proc.pid:  # the parent: gunicorn's master
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def start_server(env):
    # its log lines (one a request: part of what the accounting costs) are written, then dropped
    server = Gunicorn(env, app="bench.overhead:served()", output=subprocess.DEVNULL)
    wait_until(lambda: requests.get(server.url + "/healthz", timeout=5).ok, "the app answers", timeout=60)
    return server


@contextlib.contextmanager
def lines_dropped():
    """The accounting's log lines written to /dev/null (written all the same: they are part of its cost)."""
    from appstats import accounting
    with open(os.devnull, "w") as devnull, contextlib.ExitStack() as restore:
        for lines in (accounting.LOCAL_LINES, accounting.CLOUD_LINES):
            restore.callback(lines.handlers[0].setStream, lines.handlers[0].setStream(devnull))
        yield


def under_the_model(env, profile, n=100):
    """{"front": ms, "floor": ms}: medians of `n` requests each under LATENCY=`profile`, one at a time, in turn, in
    this process: the front page as a visitor gets it, and the floor, one modelled cache get of the page's bytes."""
    from core.cache import CountedClient
    from core.settings import Settings
    from main import create_app
    app = create_app(Settings.from_env({**os.environ, **env, "LATENCY": profile}))
    rt, visitor = runtime.of(app), app.test_client()
    floor = CountedClient(rt.cache_client, rt.latency)
    times = {"front": [], "floor": []}
    with lines_dropped():
        page = visitor.get("/blog/demo").get_data()
        floor.add(f"{FLOOR_KEY}-modelled", page, 0)
        for _ in range(n):
            started = time.perf_counter()
            assert visitor.get("/blog/demo").status_code == 200
            times["front"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert floor.get(f"{FLOOR_KEY}-modelled")
            times["floor"].append(time.perf_counter() - started)
    rt.close()
    return {name: harness.median(seconds) * 1000 for name, seconds in times.items()}


def accounting_in_process(env, pairs=200, block=20, on_app_engine=False):
    """The accounting's own cost, steady: the front page served in this process, by the app and by the same app with
    costs not counted, in alternating blocks of `block` requests, timed by the serving thread's own CPU time
    (time.thread_time: neither what the machine gives to others nor the wait for memcached counts). Each request is
    served as a gunicorn worker serves it, by gunicorn's own code: its parser reads the request, `wsgi.create` makes
    the environ and the response, the app runs, and gunicorn's Response checks and writes the headers and the body,
    to a socket that takes the bytes and sends nothing (the kernel's share is left out, and the longer response's
    few hundred bytes more are a small part of it). So the server's handling of the `Server-Timing` header is in the
    figure, and so is the log line (written to /dev/null). `on_app_engine`: both apps as there, each line a Cloud
    Logging entry (JSON, with the trace App Engine sends) rather than the readable line.
    Medians over `pairs` pairs of blocks: ({"on": us, "off": us}, the pairs' median difference in us)."""
    from gunicorn.config import Config
    from gunicorn.http import wsgi
    from gunicorn.http.message import Request
    from gunicorn.http.unreader import IterUnreader

    from core.settings import Settings
    settings = dataclasses.replace(Settings.from_env(dict(os.environ, **env)), on_app_engine=on_app_engine)
    apps = dict(zip(("on", "off"), on_and_off(settings), strict=True))
    trace = "X-Cloud-Trace-Context: 105445aa7843bc8bf206b12000100000/1;o=1\r\n" if on_app_engine else ""
    raw = (f"GET /blog/demo HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: wrk\r\n{trace}\r\n").encode()
    cfg, peer, here = Config(), ("127.0.0.1", 50000), ("127.0.0.1", 8000)

    class Sent:  # the socket gunicorn writes the response to: it takes the bytes, and sends nothing
        def sendall(self, data):
            pass

    sock = Sent()

    def served(name, n):
        app = apps[name]
        started = time.thread_time()
        for _ in range(n):
            response, environ = wsgi.create(Request(cfg, IterUnreader([raw]), peer, 1), sock, peer, here, cfg)
            body = app(environ, response.start_response)
            for chunk in body:
                response.write(chunk)
            body.close()
            response.close()
            assert response.status_code == 200, response.status
        return (time.thread_time() - started) / n * 1e6

    per_request = {"on": [], "off": []}
    with lines_dropped():
        for name in ("on", "off", "on", "off"):  # warm: templates, pages kept, connections
            served(name, 200)
        for i in range(pairs):
            for name in ("on", "off") if i % 2 == 0 else ("off", "on"):
                per_request[name].append(served(name, block))
    for app in apps.values():
        runtime.of(app).close()
    return ({name: harness.median(v) for name, v in per_request.items()},
            harness.median([a - b for a, b in zip(per_request["on"], per_request["off"], strict=True)]))


def main(argv=None):
    global WRK
    parser = argparse.ArgumentParser(prog="python -m bench.overhead")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args(argv)
    WRK = debian_binary("wrk", "wrk")
    stack = Stack(consistency=1.0, backend=backend_from_env()).start()
    server = None
    try:
        env = app_env(stack, "bench-overhead", admins="", latency="none")
        subprocess.run([sys.executable, "-m", "flask", "seed"], env=dict(os.environ, **env), cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)
        server = start_server(env)
        # (path, Host): the app with the accounting off is the same gunicorn's, by its Host name
        variants = {BARE: (BARE_PATH, None), FLOOR: (FLOOR_PATH, None), FRONT: ("/blog/demo", None),
                    OFF: ("/blog/demo", OFF_HOST), "/healthz": ("/healthz", None)}
        for path, host in variants.values():  # warm: templates compiled, caches filled, connections pooled
            wrk(server.url + path, 1, host)
        # what production would bill one warm request of each (the bare view and the app counting no costs say nothing)
        bills = {name: requests.get(server.url + path, headers={"Host": host} if host else {},
                                    timeout=10).headers.get("Server-Timing") for name, (path, host) in variants.items()}
        rates, cpu = {name: [] for name in variants}, {name: [] for name in variants}
        pairs = []  # the accounting on / off by requests/s, each second's pair
        for r in range(args.rounds):
            # Each variant's seconds are taken one at a time, the variants in turn, so that each round's variants share
            # the same spells of this shared machine's speed (it swings twofold within minutes); every other second
            # in the reverse order, so that a drift within the turn weighs on both ends alike.
            served = {name: [0, 0.0, 0.0] for name in variants}  # requests, seconds, server CPU seconds
            for second in range(args.seconds):
                this_second = {}
                for name in list(variants)[::1 if second % 2 == 0 else -1]:
                    path, host = variants[name]
                    before = cpu_seconds(server)
                    n, seconds = wrk(server.url + path, 1, host)
                    served[name][0] += n
                    served[name][1] += seconds
                    served[name][2] += cpu_seconds(server) - before
                    this_second[name] = n / seconds
                pairs.append(this_second[FRONT] / this_second[OFF])
            for name, (n, seconds, cpu_s) in served.items():
                rates[name].append(n / seconds)
                cpu[name].append(cpu_s / n * 1e6)
            print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f}/s {cpu[n][-1]:.0f} us" for n in variants),
                  flush=True)
        server.stop()  # the in-process figure gets the machine to itself
        server, in_process = None, (accounting_in_process(env), accounting_in_process(env, on_app_engine=True))
        return report(args, rates, cpu, stack.backend, bills, in_process, pairs,
                      {profile: under_the_model(app_env(stack, "bench-overhead", admins="", latency=profile), profile)
                       for profile in harness.PROFILES})
    finally:
        if server is not None:
            server.stop()
        stack.stop()


def ratio(numerators, denominators):
    """The median of the rounds' ratios, so that a slow spell of the shared machine weighs on both sides alike."""
    return harness.median([a / b for a, b in zip(numerators, denominators, strict=True)])


def report(args, rates, cpu, backend, bills, in_process, pairs, modelled):
    (in_us, in_diff), (gae_us, gae_diff) = in_process
    each_round = ", ".join(f"{a / b:.2f}" for a, b in zip(rates[FRONT], rates[OFF], strict=True))
    medians = {name: harness.median(v) for name, v in rates.items()}
    rows = [[name, f"{m:.0f}", f"{min(rates[name]):.0f}-{max(rates[name]):.0f}", f"{m / medians[BARE]:.2f}",
             f"{harness.median(cpu[name]):.0f}", harness.bill_cell_of(bills[name])]
            for name, m in medians.items()]
    front, floor, accounting = ratio(rates[FRONT], rates[BARE]), ratio(rates[FRONT], rates[FLOOR]), \
        ratio(rates[FRONT], rates[OFF])
    # the same three in the server's CPU per request (the lighter side's over the heavier's)
    by_cpu = [["front page / bare Flask view", f"{ratio(cpu[BARE], cpu[FRONT]):.2f}", f"{front:.2f}"],
              ["front page / floor", f"{ratio(cpu[FLOOR], cpu[FRONT]):.2f}", f"{floor:.2f}"],
              ["accounting on / off", f"{ratio(cpu[OFF], cpu[FRONT]):.2f}", f"{accounting:.2f}"]]
    text = f"""# Per-request overhead: the app's cheapest pages against a bare Flask view

{harness.machine_line([backend])}. gunicorn 2 workers x 8 threads serving the app and a bare Flask view (a 4.4 KB
string) in the same processes, and the same app counting no costs beside it, reached by its own Host name. wrk,
{CONNECTIONS} keep-alive connections, {args.seconds:g} s per variant in each of {args.rounds} rounds, taken a second
at a time, the variants in turn (every other second in the reverse order); medians.
A visitor (no session cookie), the demo content of `flask seed`, every cache warm.

{harness.markdown_table(["variant", "requests/s (median)", "range", "of the bare view",
                         "server CPU per request (us, median)", "billed per request"], rows)}

Server CPU: the user and system time of the server's workers while wrk ran, over the requests served. It leaves out
what the machine gave to others and what wrk itself took, so it is the steadier figure on this shared machine. The
ratios both ways (medians of the rounds' ratios):

{harness.markdown_table(["ratio", "by server CPU per request", "by requests/s"], by_cpu)}

## What the accounting costs (reported; issue #39 withdrew its target)

The accounting on / off in each round, by requests/s: {each_round}; by pairs of seconds, the median of {len(pairs)}
ratios is {harness.median(pairs):.2f}. That swing is this machine's, so the accounting is also measured in this
process: the front page served by gunicorn's own code (its parser, `wsgi.create`, the app, its Response checking and
writing the headers and the body) to a socket that sends nothing, on and off in alternating blocks of 20 requests, by
the serving thread's own CPU time; medians of 200 pairs. On {in_us["on"]:.1f} us, off {in_us["off"]:.1f} us a request:
the accounting (its header, footer, log line and record) is {in_diff:.1f} us. On App Engine's settings (each line a
Cloud Logging entry, JSON, with the request's trace): on {gae_us["on"]:.1f} us, off {gae_us["off"]:.1f} us, the
accounting {gae_diff:.1f} us. One Datastore Lookup under the production latency model waits a median of
{production_latency.LOOKUP.median_ms * 1000:,.0f} us, a cache call {production_latency.CACHE.median_ms * 1000:,.0f} us
(core/production_latency.py, with whose figures they are).

## The front page under the production latency model

One request at a time, in this process, medians of 100 each, in turn: the front page as a visitor gets it (Flask, the
session, its entries from the cache, the template), and the floor, one modelled cache get of the same bytes. The
front page makes no Commit, the one call the two profiles wait differently for, so they differ only by chance.

{harness.markdown_table(["profile", "front page ms", "floor ms", "a kept copy could save at most, ms"],
                        [[f"LATENCY={p}", f"{m['front']:.1f}", f"{m['floor']:.1f}", f"{m['front'] - m['floor']:.1f}"]
                         for p, m in modelled.items()])}

That saving is a visitor's page load at most, which the network between them and Google takes tens of milliseconds
for: every page is served by Flask.

{harness.WHOSE_FIGURES}

{harness.BILL_NOTE}
"""
    return harness.publish("overhead", text, [])


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
