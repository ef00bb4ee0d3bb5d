"""What every benchmark shares: its own stack, writers on threads, percentiles, medians over rounds, and output.

A benchmark starts its own in-memory emulator and memcached (never the ones `make run` or the tests use), runs every
variant side by side in each round, repeats the rounds, and reports medians and ratios: this machine is shared and
noisy, so only figures measured together in one run are compared.
"""
import argparse
import collections
import concurrent.futures
import contextvars
import datetime
import os
import platform
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from core import billing, costs, production_latency, runtime
from core.transactions import transact
from devstack import Stack
from devstack.apps import app_on
from devstack.services import BACKENDS, backend_from_env
from devstack.taskqueue import DrainedQueue

RESULTS = Path(__file__).resolve().parent / "results"


BACKEND_NAMES = {"legacy": "legacy Datastore emulator", "firestore": "Firestore emulator (Datastore mode)"}
LATENCIES = production_latency.NAMES  # the columns: bare, and under each profile of the production latency model
PROFILES = production_latency.PROFILES  # the columns `make bench` measures unless LATENCY names one
LATENCY_NAMES = {"none": "bare emulator", "production": "LATENCY=production",
                 "multi-region": "LATENCY=multi-region"}


def main_per_column(prog, argv, measure, report, seconds=8.0, extra=None):
    """A benchmark measured in every column of one run, side by side: each backend (`--backends`, default
    DATASTORE's when it is set, else both), under each profile of the production latency model (`--latency`: none,
    production, multi-region, comma-separated, or all; default LATENCY's when it is set, else both profiles,
    production and multi-region; core/production_latency.py). measure(args, stack, app) on a fresh stack per column,
    then report(args, {(backend, latency): measured}) -> verdict."""
    def with_latency(parser):
        add_latency_argument(parser)
        if extra:
            extra(parser)
    args = _arguments(prog, argv, seconds, with_latency)
    latencies = latencies_named(args.latency)
    measured = {}
    for backend in _backends(args):
        for latency in latencies:
            print(f"--- {prog} on {backend}, {LATENCY_NAMES[latency]}", flush=True)
            stack, app = start_stack(backend, latency)
            rt = runtime.of(app)
            try:
                with rt.activated():
                    measured[(backend, latency)] = measure(args, stack, app)
            finally:
                rt.close()
                stack.stop()
    return report(args, measured)


def add_latency_argument(parser):
    """`--latency`: the profiles to measure under, LATENCY's when it is set, else both profiles."""
    parser.add_argument("--latency", default=os.environ.get("LATENCY") or ",".join(PROFILES),
                        help="none, production, multi-region (comma-separated), or all")


def bounded(low, high):
    """An argparse type: a whole number from `low` to `high`."""
    def parse(text):
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high}")
        return value
    return parse


def latencies_named(text):
    """`--latency`'s value as the profiles it names (none, production, multi-region, or all); SystemExit naming the
    choices for any other."""
    named = list(LATENCIES) if text == "all" else text.split(",")
    unknown = [n for n in named if n not in LATENCIES]
    if unknown:
        raise SystemExit(f"--latency takes {', '.join(LATENCIES)} (comma-separated) or all; not {', '.join(unknown)}")
    return named


def _arguments(prog, argv, seconds, extra):
    """The arguments every benchmark takes (rounds, seconds, backends), and `extra(parser)`'s."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--backends", default=os.environ.get("DATASTORE") or ",".join(BACKENDS),
                        help="legacy, firestore or both (comma-separated)")
    if extra:
        extra(parser)
    return parser.parse_args(argv)


def _backends(args):
    return BACKENDS if args.backends == "both" else args.backends.split(",")


def column_tag(app):
    """A prefix that names this column's entities apart from every other column's of the same run: a process keeps
    state per counter name (an adaptive counter's contention window, counters/growth.py), so a name that grew on the
    legacy column's stack would never be judged again on Firestore's, where its counter starts at one shard anew."""
    settings = runtime.of(app).settings
    return f"{settings.backend}-{settings.latency}-"


def column_name(column):
    backend, latency = column
    return f"{BACKEND_NAMES[backend]}, {LATENCY_NAMES[latency]}"


def start_stack(backend=None, latency="none"):
    """A fresh stack (`backend`, else DATASTORE's) and an app on it, waiting production's round trips when `latency`
    names a profile ("production", "multi-region"): (stack, app). Its tasks wait in a queue the benchmark drains itself
    (devstack.taskqueue.DrainedQueue)."""
    stack = Stack(consistency=1.0, backend=backend or backend_from_env()).start()
    app = app_on(stack, task_queue=DrainedQueue(), SECRET_KEY="bench", LATENCY=latency)
    return stack, app


def _counted_in(pattern):
    """A reader of one count in a response's Server-Timing header (0 without the header or the count)."""
    compiled = re.compile(pattern)

    def count(server_timing):
        match = compiled.search(server_timing or "")
        return int(match[1]) if match else 0
    return count


rpcs_in = _counted_in(r'datastore;desc="(\d+) RPC')  # the Datastore RPCs a response made
queries_in = _counted_in(r"(\d+) RunQuery")  # those of them that were queries
retried_in = _counted_in(r'retried;desc="(\d+) transaction')  # transactions retried after a collision


WHOSE_FIGURES = (
    "Whose figures: the bills and the critical paths (in RPCs) are production's: the same RPCs are billed, and must "
    "follow one another, there. Wall times under LATENCY=production (a regional database) and LATENCY=multi-region "
    "(nam5-like Commits) are the stand-in's (devstack/standin.py): one gRPC proxy in front of the emulator that every "
    "client of the run reaches, which waits each RPC's modelled round trip less the emulator's own time for it, and "
    "makes every client's commits to one entity take turns at production's rate, answering ABORTED past the bound. "
    "Its figures are core/production_latency.py's, published measurements or, where none exists, inferences: "
    f"{production_latency.SUMMARY} "
    "They are waited on this machine's 2 cores, where production would have many instances. "
    "Bare wall times are this machine's alone: the emulators answer in microseconds, from the same 2 cores as the app.")


_METHODS = re.compile(r'(\d+) ([\w.]+)')


def modelled_path(server_timing, latency):
    """(RPCs, cache calls, modelled seconds) of one request from its Server-Timing header: its Datastore RPCs by method
    and its cache calls, each at its median round trip under the profile `latency` (core/production_latency.py). For a
    request whose calls follow one another (one post: a transaction), that is its critical path under the model."""
    model = production_latency.Model(latency)
    found = {m["name"]: m["desc"] for m in re.finditer(r'(?P<name>datastore|cache);desc="(?P<desc>[^"]*)"',
                                                       server_timing or "")}
    rpcs = {method: int(n) for n, method in _METHODS.findall(found.get("datastore", "").partition(":")[2])}
    calls = sum(int(n) for n, _ in _METHODS.findall(found.get("cache", "").partition(":")[2]))
    seconds = (sum(n * model.datastore.get(m, production_latency.UNKNOWN_RPC).median_ms for m, n in rpcs.items())
               + calls * production_latency.CACHE.median_ms) / 1000
    return sum(rpcs.values()), calls, seconds


def timed_path(server_timing):
    """Seconds a request spent in its Datastore RPCs and cache calls, as timed where it ran (its Server-Timing
    durations): under a profile, the model's waits plus the emulator's, the cache's and the client's own time."""
    durations = re.findall(r'(?:datastore|cache);desc="[^"]*";dur=([\d.]+)', server_timing or "")
    return sum(float(d) for d in durations) / 1000


class TaskChains:
    """The critical path of a tree of tasks, in Datastore RPCs: the longest chain of RPCs that must follow one another,
    whatever the number of workers. A task can start only once the delivery that enqueued it has made the RPCs it made
    before enqueueing it; its own deliveries' RPCs follow one another. So a task's chain ends at
    (its parent's chain where the parent enqueued it) + (its own RPCs), and the longest of those is the job's. It
    depends on the code and the data, not on this machine: what production gains with enough instances.

    Watches the app's queue (a DrainedQueue) as tasks are enqueued, and each delivery as `delivered(task, header)`
    reports it; `delivering(task)` marks the thread's delivery so that an enqueue knows its parent."""

    def __init__(self, queue):
        self.starts = {}  # task name -> RPCs on its chain before it could start
        self.own = collections.defaultdict(int)  # task name -> the RPCs of its deliveries
        self._current = contextvars.ContextVar("delivering", default=None)
        enqueue = queue.enqueue

        def watched(name, payload, task_name, delay=0):
            cost, parent = costs.current(), self._current.get()
            made = sum(cost.datastore.values()) if cost is not None else 0
            self.starts.setdefault(task_name, (self.starts.get(parent, 0) if parent else 0) + made)
            return enqueue(name, payload, task_name, delay)
        self._queue, self._enqueue = queue, enqueue
        queue.enqueue = watched

    def close(self):
        """Stop watching the queue."""
        self._queue.enqueue = self._enqueue

    def delivering(self, task):
        self._current.set(task.name)

    def delivered(self, task, server_timing):
        self.own[task.name] += rpcs_in(server_timing)

    def critical_path(self):
        return max((self.starts.get(name, 0) + rpcs for name, rpcs in self.own.items()), default=0)


def one_entity_transaction(fn, key, base):
    """fn() in a transaction on the one entity `key` that every writer shares: the rejected design at its best, so
    that a ratio against it flatters nobody. At most 10 attempts; one that gives up is an error, counted.
    - Legacy (optimistic: collisions abort at once): retried after a jittered backoff from `base` seconds.
      Measured under LATENCY=production, 32 writers on one comment sequence: 25.4 commits/s, against 18.8 in turn.
    - Firestore (pessimistic: two transactions that read the entity both wait out the emulator's 2.3 s lock timeout,
      core/hotspots.py): in turn at the entity, as the app's own hot entities are. Backed off instead it committed
      nothing in 6 s; in turn, 16.8 commits/s."""
    if runtime.current().settings.backend == "firestore":
        return transact(fn, max_attempts=10, hot_key=key)
    return transact(fn, max_attempts=10, base=base, cap=1.0)


def in_context(fn):
    """fn wrapped to run in its own ndb context, with the benchmark's runtime current, as one request does."""
    return runtime.current().in_context(fn)


def billed(fn):
    """fn wrapped to return (its result, what production would bill it: a core.billing.Billed), counted from its
    Datastore RPCs' answers as a request's are. Bills do not vary from run to run: one call says it."""
    def call(*args, **kwargs):
        with costs.measured() as cost:
            result = fn(*args, **kwargs)
        return result, cost.billed
    return call


def billed_from_header(header):
    """The bill a response's Server-Timing header states in its `billed` metric (core/costs.py writes it)."""
    match = re.search(r'billed;desc="(?P<desc>[^"]*)"', header or "")
    counts = {what.rstrip("s"): int(n) for n, what in
              re.findall(r"(\d+) (reads?|writes?|deletes?)", match["desc"] if match else "")}
    return billing.Billed(reads=counts.get("read", 0), writes=counts.get("write", 0), deletes=counts.get("delete", 0))


def bill_cell(bill):
    """'25 reads ($7.50/M)': a table cell, per operation and in USD per million operations (us-central1)."""
    return f"{bill.describe()} (${bill.usd_per_million():.2f}/M)"


def bill_cell_of(server_timing):
    """The table cell for a response's own bill (its Server-Timing header), or "not counted" when it has none (an
    app counting no costs, a view outside the app)."""
    return bill_cell(billed_from_header(server_timing)) if server_timing else "not counted"


BILL_NOTE = (f"Billed: what Firestore in Datastore mode would bill one such operation in production, counted from "
             f"its RPCs' answers (core/billing.py), and in USD per million such operations at "
             f"{billing.PRICES_LOCATION} prices read {billing.PRICES_READ_ON}. Unlike the times, the bills carry over "
             f"to production exactly: the same RPCs bill the same on both emulators. Where the app takes another path "
             f"on each backend (an increment: a transaction that reads its shard on legacy, a blind server-side "
             f"increment on Firestore), the bills differ, and Firestore's is production's.")


@dataclass
class Load:
    """What `writers` threads achieved calling one operation for a while."""
    writers: int
    elapsed: float = 0.0
    latencies: list = field(default_factory=list)
    attempts: list = field(default_factory=list)
    errors: int = 0
    warm_commits: int = 0

    @property
    def commits(self):
        return len(self.latencies)

    @property
    def per_second(self):
        return self.commits / self.elapsed if self.elapsed else 0.0

    @property
    def attempts_per_commit(self):
        return sum(self.attempts) / len(self.attempts) if self.attempts else 0.0

    def pct(self, q):
        return percentile(self.latencies, q)


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def run_writers(writers, op, seconds, warmup=0.0, max_ops_per_writer=10_000):
    """`writers` threads call op(writer_index) for `warmup` + `seconds` (bounded in count too); only the calls that
    start after the warm-up are measured (the warm-up's calls still count toward `warm_commits`).

    op returns the number of attempts it made (or None for 1). Every call runs in its own ndb context.
    """
    load = Load(writers)
    lock = threading.Lock()
    op = in_context(op)
    barrier = threading.Barrier(writers + 1)

    def writer(i):
        barrier.wait()
        mine, warm = [], 0
        for _ in range(max_ops_per_writer):
            now = time.perf_counter()
            if now >= deadline:
                break
            if now < measure_from:
                try:
                    op(i)
                    warm += 1
                except Exception:  # noqa: BLE001
                    pass
                continue
            start = time.perf_counter()
            try:
                attempts = op(i) or 1
            except Exception:  # noqa: BLE001 - counted and reported, a benchmark keeps going
                with lock:
                    load.errors += 1
                continue
            mine.append((time.perf_counter() - start, attempts))
        with lock:
            load.latencies += [lat for lat, _ in mine]
            load.attempts += [a for _, a in mine]
            load.warm_commits += warm

    with concurrent.futures.ThreadPoolExecutor(max_workers=writers) as pool:
        futures = [pool.submit(writer, i) for i in range(writers)]
        measure_from = time.perf_counter() + warmup
        deadline = measure_from + seconds
        barrier.wait()
        concurrent.futures.wait(futures)
        end = time.perf_counter()
    load.elapsed = end - measure_from
    return load


def median(values):
    values = [v for v in values if v == v]  # drop NaN
    return statistics.median(values) if values else float("nan")


def markdown_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_line(backends=None):
    where = " and ".join(BACKEND_NAMES[b] for b in backends) if backends else "Cloud Datastore emulator"
    # The machine is shared: its load when the results were written says how much of the 2 cores the run had.
    load = os.getloadavg()[1]
    return (f"{datetime.date.today().isoformat()}, {platform.machine()} with {os.cpu_count()} cores (load average "
            f"{load:.1f} over the last 5 minutes when written), Python {platform.python_version()}, {where} + "
            f"memcached on loopback")


def write_result(name, text):
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(text)
    return path


def target(claim, measured, wanted, met):
    """One row of a benchmark's targets: the claim, the figure measured, the target it had to reach, the verdict."""
    return [claim, measured if isinstance(measured, str) else f"{measured:.2f}", wanted, "met" if met else "**missed**"]


def publish(name, text, targets):
    """bench/results/<name>.md: `text`, then its targets (rows of `target`) as a table; printed too. Whether every
    target was met."""
    if targets:
        text += f"\n## Targets\n\n{markdown_table(['claim', 'measured', 'target', ''], targets)}\n"
    path = write_result(name, text)
    print(text)
    print(f"written: {path}")
    return all(row[-1] == "met" for row in targets)


def bar_chart(name, groups, series, values, title, log=False):
    """A grouped bar chart in bench/results/<name>.svg: for each group (a backend), one bar per series;
    values[(group, series)]."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(series)
    for n, label in enumerate(series):
        xs = [i + (n - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [max(values[(g, label)], 0.01) for g in groups], width, label=label)
    ax.set_xticks(range(len(groups)), [BACKEND_NAMES.get(g, g) for g in groups])
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend(frameon=False)
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    fig.savefig(RESULTS / f"{name}.svg")

