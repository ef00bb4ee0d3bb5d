"""`make load URL=... [SCENARIO=...]`: the lessons' comparisons over HTTP, with Locust, against `make run` or a
deployment of your own.

The in-process benchmarks (bench/counters.py, bench/comments.py, bench/blog.py) measure the emulators on this machine;
bare, production costs differ (Firestore holds one document to about one sustained write a second, the emulator does
not; `make run LATENCY=production` puts the stand-in, devstack/standin.py, in front of it, which does).
This runs the same comparisons through the front door of a running app, each scenario's variants one after another in
every round (side by side, so a noisy machine or network moves them alike), medians over rounds:

- counters:  increments of a one-shard counter (one entity) vs the default 20 shards vs an adaptive counter;
             then every acknowledged increment is looked for in the shards (exact, read by key).
- frontpage: a blog's front page as served (from the cache) vs read as if there were no cache (`?cache=bypass`,
             admins only); the demo blog when there is one.
- comments:  every user commenting on one entry (each comment in its commenter's own entity group, the talk's design)
             vs every user posting to one blog, where each post takes the next index from the one BlogIndex entity:
             the shared sequence the talk rejects, in the app's own code.

Bounded: at most 64 users, 300 s per variant, 5 rounds. Setup (counters, a blog, sign-ins) uses the API: locally the
dev sign-in; on App Engine, give `--token` (a Google ID token for the app's client; docs/load.md, "Load-testing a
deployment").
Writes bench/results/load.md and load.csv (or --out). Run: `make load [URL=...] [SCENARIO=...] [LOAD_ARGS=...]`.
"""
import argparse
import csv
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import requests

from bench import harness

HERE = Path(__file__).resolve().parent
LOCUSTFILE = HERE / "locustfile.py"
RESULTS = HERE / "results"
MAX_USERS, MAX_SECONDS, MAX_ROUNDS = 64, 300, 5


class LoadError(RuntimeError):
    """The target cannot be load-tested as asked; the message says why."""


class Target:
    """The app under load, and the identities its scenarios act as."""

    def __init__(self, url, tokens=()):
        self.url = url.rstrip("/")
        self.tokens = list(tokens)
        self.http = requests.Session()

    def identity(self, email, admin=False):
        """Headers that make a request someone's: locally the dev sign-in's session as `email`; on App Engine, a
        session signed in with one of the given Google ID tokens (whose identity it is, the token says)."""
        if self.tokens:
            r = requests.post(f"{self.url}/api/session", timeout=30,
                              json={"credential": self.tokens[hash(email) % len(self.tokens)]})
        else:
            r = requests.post(f"{self.url}/api/session", json={"email": email, "admin": admin}, timeout=30)
        if r.status_code == 404 and not self.tokens:
            raise LoadError(f"{self.url} has no dev sign-in (App Engine): pass --token with a Google ID token for the "
                            "app's client id (docs/load.md, 'Load-testing a deployment').")
        if r.status_code >= 400:
            raise LoadError(f"signing in as {email} failed: HTTP {r.status_code} {r.text[:200]}")
        return {"Cookie": "; ".join(f"{k}={v}" for k, v in r.cookies.items())}

    def call(self, method, path, headers=None, body=None, ok=(200, 201)):
        """The JSON answer, or None for a 404 the caller allows (`ok`)."""
        r = self.http.request(method, self.url + path, json=body, headers=headers or {}, timeout=60)
        if r.status_code not in ok:
            raise LoadError(f"{method} {path}: HTTP {r.status_code} {r.text[:300]}")
        return r.json() if r.content and r.status_code != 404 else None


def counters(target, run):
    admin = target.identity("load-admin@example.com", admin=True)
    names = {"one entity": f"load-{run}-single", "sharded": f"load-{run}-sharded", "adaptive": f"load-{run}-adaptive"}
    modes = {"one entity": {"mode": "general", "num_shards": 1}, "sharded": {"mode": "general"},
             "adaptive": {"mode": "adaptive"}}
    for variant, name in names.items():
        target.call("PUT", f"/api/counters/{name}", admin, modes[variant])
    specs = {v: {"name": v, "method": "POST", "path": f"/api/counters/{n}/increment"} for v, n in names.items()}

    def check(served, users):
        """Every acknowledged increment is in the shards (read by key: exact). The shards may hold a few more: a
        request still unanswered when a variant's time ran out was applied but never acknowledged, at most one per
        user per round. Anything outside that is a lost or a doubled increment."""
        lines = []
        for variant, name in names.items():
            counted = sum(target.call("GET", f"/api/counters/{name}?shards=1")["shards"])
            acknowledged = served[variant]
            verdict = ("exact" if counted == acknowledged else
                       f"{counted - acknowledged} unanswered at the stop" if 0 < counted - acknowledged <= users else
                       "LOST OR DOUBLED INCREMENTS")
            lines.append(f"{variant}: {acknowledged:,} acknowledged, {counted:,} counted ({verdict})")
        return lines

    return specs, [("sharded", "one entity"), ("adaptive", "one entity")], check


def frontpage(target, run, blog=None):
    """The front page of `blog` (default: the demo blog when the target has one: its entries have views and comments,
    whose counts the uncached page sums from their shards, as the benchmark's blog does), else of a blog of its own."""
    admin = target.identity("load-admin@example.com", admin=True)
    blog = blog or ("demo" if target.call("GET", "/api/blogs/demo/entries", ok=(200, 404)) else None)
    if blog is None:
        blog = f"load-{run}"
        for i in range(11):  # a full front page and an older one
            target.call("POST", f"/api/blogs/{blog}/entries", admin,
                        {"title": f"Entry {i}", "body": "Some *text*. " * 40})
    specs = {"cached": {"name": "cached", "method": "GET", "path": f"/blog/{blog}"},
             "uncached": {"name": "uncached", "method": "GET", "path": f"/blog/{blog}?cache=bypass",
                          "identities": [admin]}}
    return specs, [("cached", "uncached")], None


def comments(target, run, users):
    admin = target.identity("load-admin@example.com", admin=True)
    blog, shared = f"load-{run}", f"load-{run}-sequence"
    target.call("POST", f"/api/blogs/{blog}/entries", admin, {"title": "Comment here", "body": "Under load."})
    commenters = [target.identity(f"load-user-{i}@example.com") for i in range(users)]
    specs = {"designed": {"name": "designed", "method": "POST", "path": f"/api/blogs/{blog}/entries/0/comments",
                          "body": {"text": "A comment under load."}, "identities": commenters},
             "shared": {"name": "shared", "method": "POST", "path": f"/api/blogs/{shared}/entries",
                        "body": {"title": "Post", "body": "One shared sequence."}, "identities": [admin]}}
    return specs, [("designed", "shared")], None


SCENARIOS = ("counters", "frontpage", "comments")


def run_locust(target, spec, args, workdir):
    """One variant, headless and bounded; its figures from Locust's CSV."""
    prefix = workdir / spec["name"].replace(" ", "-")
    command = [str(Path(sys.executable).parent / "locust"), "-f", str(LOCUSTFILE), "--headless",
               "-u", str(args.users), "-r", str(args.spawn_rate), "-t", f"{args.seconds}s", "--host", target.url,
               "--csv", str(prefix), "--only-summary", "--stop-timeout", "10", "--exit-code-on-error", "0",
               "-L", "WARNING"]
    tally = Path(f"{prefix}_tally.json")
    done = subprocess.run(command, env=dict(os.environ, LOAD_SPEC=json.dumps(spec), LOAD_TALLY=str(tally)),
                          capture_output=True, text=True, timeout=args.seconds + 120, check=False)
    rows = {}
    stats = Path(f"{prefix}_stats.csv")
    if stats.exists():
        with open(stats, newline="") as f:
            rows = {row["Name"]: row for row in csv.DictReader(f)}
    row = rows.get("Aggregated")
    if done.returncode != 0 or row is None:
        raise LoadError(f"locust failed on {spec['name']} (exit {done.returncode}):\n{done.stderr[-2000:]}")
    seen = json.loads(tally.read_text()) if tally.exists() else None
    if seen is None:
        raise LoadError(f"locust wrote no tally for {spec['name']}:\n{done.stderr[-2000:]}")
    return {"served_per_s": float(row["Requests/s"]) - float(row["Failures/s"]), "served": seen["served"],
            "requests": seen["served"] + seen["refused"], "failures": seen["refused"],
            "median_ms": float(row["Median Response Time"] or 0)}


def measure(target, scenario, args, run):
    setup = {"counters": lambda: counters(target, run), "frontpage": lambda: frontpage(target, run, args.blog),
             "comments": lambda: comments(target, run, args.users)}[scenario]
    specs, ratios, check = setup()
    rounds = {variant: [] for variant in specs}
    with tempfile.TemporaryDirectory(prefix="load-") as tmp:
        for r in range(args.rounds):
            for variant, spec in specs.items():
                figures = run_locust(target, spec, args, Path(tmp) / f"r{r}")
                rounds[variant].append(figures)
                print(f"  {scenario} round {r + 1}: {variant:<11} {figures['served_per_s']:8.1f} served/s, "
                      f"median {figures['median_ms']:.0f} ms, {figures['failures']:,} refused", flush=True)
    summary = {v: {"served_per_s": statistics.median(x["served_per_s"] for x in rs),
                   "median_ms": statistics.median(x["median_ms"] for x in rs),
                   "refused": sum(x["failures"] for x in rs) / max(1, sum(x["requests"] for x in rs)),
                   "served": sum(x["served"] for x in rs)} for v, rs in rounds.items()}
    ratio_rows = [(a, b, summary[a]["served_per_s"] / summary[b]["served_per_s"]
                   if summary[b]["served_per_s"] else float("inf")) for a, b in ratios]
    checks = check({v: s["served"] for v, s in summary.items()}, args.users * args.rounds) if check else []
    for variant, spec in specs.items():  # one more request each, after the checks: what production bills it
        summary[variant]["billed"] = _billed(target, spec)
    return rounds, summary, ratio_rows, checks


def _billed(target, spec):
    """What production would bill one request of `spec` (its Server-Timing header; core/billing.py)."""
    identities = spec.get("identities") or [{}]
    r = target.http.request(spec["method"], target.url + spec["path"], json=spec.get("body"), headers=identities[0],
                            timeout=60)
    return harness.bill_cell_of(r.headers.get("Server-Timing"))


def _waits(target):
    """Whose waits the server's times include, from its /healthz's Server-Timing: a latency profile names itself there
    (core/costs.py), so a `make run LATENCY=...` is told from a bare one; a deployment waits production's own."""
    r = target.http.get(target.url + "/healthz", timeout=60)
    if r.status_code != 200:
        raise LoadError(f"GET /healthz: HTTP {r.status_code}")
    profile = re.search(r'model;desc="(LATENCY=[a-z-]+)', r.headers.get("Server-Timing", ""))
    if profile:
        return (f"The server's Datastore is the stand-in ({profile[1]}, devstack/standin.py): every worker's RPCs wait "
                "production's modelled round trips there (core/production_latency.py), and one entity takes one write "
                "a second after a burst of 3 whoever writes it; its times are the model's, waited on the server's "
                "machine.")
    return ("The server waits no modelled round trips: on the emulators, its times are its machine's alone; on App "
            "Engine, production's own.")


def report(target, args, measured, out, waits):
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# make load: {target.url}", "",
             f"{when}; Locust, {args.users} users (spawn rate {args.spawn_rate}/s), {args.seconds} s per variant, "
             f"{args.rounds} rounds, variants side by side in each round; medians over rounds. "
             "Served/s: requests answered 2xx/3xx per second (refusals are counted apart). " + waits, "",
             harness.BILL_NOTE + " The bill is one request's, made after the variant's rounds.", ""]
    with open(f"{out}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["scenario", "variant", "round", "served_per_s", "median_ms", "requests", "failures"])
        for scenario, (rounds, summary, ratio_rows, checks) in measured.items():
            for variant, rs in rounds.items():
                for i, x in enumerate(rs, 1):
                    writer.writerow([scenario, variant, i, f"{x['served_per_s']:.1f}", f"{x['median_ms']:.0f}",
                                     x["requests"], x["failures"]])
            lines += [f"## {scenario}", "", "| variant | served/s | median ms | refused | billed per request |",
                      "|---|---:|---:|---:|---|"]
            lines += [f"| {v} | {s['served_per_s']:,.1f} | {s['median_ms']:,.0f} | {s['refused']:.1%} | "
                      f"{s['billed']} |" for v, s in summary.items()]
            lines += [""] + [f"- {a} / {b}: **{ratio:.1f}x**" for a, b, ratio in ratio_rows]
            lines += [f"- {line}" for line in checks] + [""]
    Path(f"{out}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"written: {out}.md, {out}.csv")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("URL") or "http://127.0.0.1:8080",
                        help="the app: make run's (default) or a deployment's")
    parser.add_argument("--scenario", default=os.environ.get("SCENARIO") or "all",
                        help=f"{', '.join(SCENARIOS)} or all (comma-separated)")
    parser.add_argument("--users", type=harness.bounded(1, MAX_USERS), default=16)
    parser.add_argument("--spawn-rate", type=harness.bounded(1, MAX_USERS), default=None,
                        help="default: all users at once")
    parser.add_argument("--seconds", type=harness.bounded(3, MAX_SECONDS), default=15, help="per variant per round")
    parser.add_argument("--rounds", type=harness.bounded(1, MAX_ROUNDS), default=3)
    parser.add_argument("--blog", default=None, help="frontpage's blog (default: demo when it exists, else its own)")
    parser.add_argument("--token", action="append", default=[],
                        help="a Google ID token for the app's client id, to sign in with (repeat for several "
                             "identities); default: dev sign-in")
    parser.add_argument("--out", default=str(RESULTS / "load"), help="report path without extension")
    args = parser.parse_args(argv)
    args.spawn_rate = args.spawn_rate or args.users
    chosen = SCENARIOS if args.scenario == "all" else tuple(args.scenario.split(","))
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}: choose from {', '.join(SCENARIOS)} or all")
    target = Target(args.url, args.token)
    try:
        waits = _waits(target)
    except (requests.RequestException, LoadError) as e:
        sys.exit(f"{args.url} does not answer /healthz ({e}); start it with `make run` or give URL=...")
    run = uuid.uuid4().hex[:8]
    try:
        measured = {scenario: measure(target, scenario, args, run) for scenario in chosen}
    except LoadError as e:
        sys.exit(str(e))
    report(target, args, measured, args.out, waits)


if __name__ == "__main__":
    main()
