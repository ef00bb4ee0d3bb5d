"""A batch job over a kind: the mapper's fan-out (mapper/tree.py) against one cursor walk and a non-transactional
batch pipeline: tree depth, tasks, critical path, wall time and bill."""
import contextlib
import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import ndb

from accounts.credit import ADD_CREDIT_INCREMENTS  # the job bench/mapper.py measures
from core import billing, production_latency
from core.costs import plural
from core.features import REPO
from mapper.chunks import scan_limit
from mapper.jobs import MAX_GROUPS
from mapper.models import MapperJob
from mapper.queueing import HANDED_BYTES
from mapper.service import SAMPLES
from mapper.task import TOTAL_WEIGHT, TaskPayload
from mapper.tree import split as split_children  # the split the mapper's tasks run
from planner import figures
from planner.figures import Plan, bench_tables, calls_in_turn, priced, round_trip

CHUNKS = {"legacy": ADD_CREDIT_INCREMENTS.per_transaction,
          "firestore": ADD_CREDIT_INCREMENTS.per_transaction_firestore or ADD_CREDIT_INCREMENTS.per_transaction}


# How a batch pipeline splits a kind first (Beam's ReadFromDatastore; its source in docs/lessons/numbers.md).
PIPELINE_SPLITS, SCATTER_PER_SPLIT = 12, 32
PIPELINE_SAMPLES = (PIPELINE_SPLITS - 1) * SCATTER_PER_SPLIT  # the split query's limit

# The job's own RPCs around its tree: its start (mapper/service.py start_job: its kept counters' configs come from the
# ndb global cache once they exist; the job and its root's record in one transaction), the root's first read of the
# job (not in that cache yet), its end (mapper/completion.py: the records read a get_multi a level, then the
# transaction that settles the credit onto a kept counter, reading its config and a shard).
START_TRANSACTIONS = 1
SETTLE_LOOKUPS = 2
# The legacy emulator answers a query in batches of 300 keys, and asks once more after a full batch unless the limit
# was reached (measured here: 300 keys one RunQuery, 301 to 600 two; Firestore's emulator answers 1,000 in one).
LEGACY_BATCH = 300

# The mapper's queue as queue.yaml sets it (Cloud Tasks and devstack's local queue alike): no more tasks dispatched a
# second than its rate, no more running at once than its max_concurrent_requests, whatever the instances could take.
QUEUE_YAML = REPO / "queue.yaml"
RATE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}  # queue.yaml's "50/s": https://cloud.google.com/tasks/docs/queue-yaml

# A new kind's traffic ramps up by Google's 500/50/5 rule, counted on the kind itself, as Beam's ramp-up throttle
# counts a job's writes, not the job's bookkeeping.
RAMP_SOURCE = "https://cloud.google.com/datastore/docs/best-practices#ramping_up_traffic"
RAMP_START, RAMP_GROWTH, RAMP_STEP_SECONDS = 500, 1.5, 300

# The job bench/mapper.py runs (tests/test_plan.py holds these to its ACCOUNTS, FANOUT, WORKERS, PAGE and BIG_PAGE):
# where a plan asks for it, bench/results/mapper.md's measured wall times stand beside the model's.
MAPPER_RESULTS = REPO / "bench" / "results" / "mapper.md"
BENCH_ENTITIES, BENCH_FANOUT, BENCH_WORKERS, BENCH_PAGES = 10_000, 4, 8, (100, 500)


@dataclass(frozen=True)
class Queue:
    rate: float  # tasks dispatched a second at most
    concurrent: int  # tasks running at once at most


@functools.cache
def mapper_queue(path: Path = QUEUE_YAML, name: str = "mapper") -> Queue:
    """Queue `name`'s dispatch rate and concurrency as `path` sets them, read once per process."""
    entry = next(q for q in yaml.safe_load(path.read_text(encoding="utf-8"))["queue"] if q["name"] == name)
    count, _, unit = str(entry["rate"]).partition("/")
    return Queue(float(count) / RATE_UNITS[unit], int(entry["max_concurrent_requests"]))


def ramped_seconds(operations: int, rate: float) -> float:
    """Seconds to make `operations` at `rate` a second, on a new kind held to the 500/50/5 rule: 500 a second for the
    first 5 minutes, 50% more every 5 minutes after. Steps until the rule allows `rate`: a few dozen at most."""
    seconds, left, allowed = 0.0, float(operations), float(RAMP_START)
    while allowed < rate:
        if left <= allowed * RAMP_STEP_SECONDS:
            return seconds + left / allowed
        seconds, left, allowed = seconds + RAMP_STEP_SECONDS, left - allowed * RAMP_STEP_SECONDS, allowed * RAMP_GROWTH
    return seconds + left / rate


@dataclass(frozen=True)
class MeasuredWall:
    in_process: float  # s: BENCH_WORKERS threads in one process
    served: float  # s: through devstack's local Cloud Tasks (queue.yaml) to gunicorn
    date: str


def _wall(rows: list[dict[str, str]], variant: str, page: int) -> float | None:
    """The wall time of the row of `variant` at `page` (the benchmark names a page size other than its first)."""
    for row in rows:
        named = row.get("variant", "")
        if named.startswith(variant) and (f"pages of {page}" in named if page != BENCH_PAGES[0] else
                                          "pages of" not in named):
            return float(row["wall s (median)"])
    return None


@functools.cache
def measured_walls(path: Path) -> dict[tuple[str, str, int], MeasuredWall]:
    """{(backend, profile, page size): the fan-out's measured wall time}, once per process; {} without the file."""
    date, tables = bench_tables(path)
    found = {}
    for (backend, profile), rows in tables.items():
        for page in BENCH_PAGES:
            in_process = _wall(rows, f"adaptive fan-out, {BENCH_WORKERS} workers", page)
            served = _wall(rows, "adaptive fan-out, local Cloud Tasks", page)
            if in_process is not None and served is not None:
                found[(backend, profile, page)] = MeasuredWall(in_process, served, date)
    return found


@dataclass(frozen=True)
class Calls:
    """Calls that follow one another: RPCs by what they are, and the tasks (a create and a delivery each) between."""
    queries: int = 0
    lookups: int = 0
    transactions: int = 0  # a BeginTransaction, a Lookup and a Commit each
    hops: int = 0

    @property
    def rpcs(self) -> int:
        return self.queries + self.lookups + sum(figures.TRANSACTION.values()) * self.transactions

    def __add__(self, other: "Calls") -> "Calls":
        return Calls(self.queries + other.queries, self.lookups + other.lookups,
                     self.transactions + other.transactions, self.hops + other.hops)


@dataclass(frozen=True)
class Tree:
    """The mapper's tree over evenly spread keys, as mapper/tree.py cuts it (`fan_out`)."""
    tasks: int
    range_tasks: int  # tasks that list their range (a keys-only query each)
    handing: int  # range tasks that handed pages out (each keeps them in a KeptHandouts entity)
    depth: int
    transactions: int  # chunks, each one transaction with the task's record
    path: Calls  # the longest chain of calls: for a job, from its start to its end (`fan_out`)

    @property
    def path_rpcs(self) -> int:
        return self.path.rpcs


def transactions_for(entities: int, chunk: int) -> int:
    """A page's transactions: one a chunk, and an empty page still one (its record)."""
    return max(1, math.ceil(entities / chunk))


def queries_for(listed: int, limit: int, backend: str) -> int:
    """The RunQuery RPCs of a keys-only query that returns `listed` keys of at most `limit`."""
    if backend == "firestore":
        return 1
    return math.ceil(listed / LEGACY_BATCH) if listed == limit else listed // LEGACY_BATCH + 1


# The keys a modelled range holds: add_credit's kind, spread evenly, consecutive ids from where Datastore's scattered
# ids begin (mapper/key_arithmetic.py), in the demo's project, so that a handed-out page's keys take the bytes the
# demo's accounts' take (mapper/queueing.py HANDED_BYTES).
KEYS_FROM, KEYS_PROJECT = 2 ** 52, "scalable-demo"


def _key(number: int) -> ndb.Key:
    return ndb.Key(ADD_CREDIT_INCREMENTS.kind, KEYS_FROM + number, project=KEYS_PROJECT, namespace=None, database=None)


@functools.cache
def _offline_client() -> ndb.Client:
    return ndb.Client(project=KEYS_PROJECT, credentials=AnonymousCredentials())


@functools.cache
def split_sizes(entities: int, page: int, fanout: int) -> tuple[list[int], list[int]]:
    """What mapper/tree.py's own split makes of a range task's range of `entities` evenly spread keys, more than a page:
    (the sizes of the pages it hands out whole, the sizes of the ranges it splits the rest into)."""
    job = MapperJob(page_size=page, fanout=fanout, samples=[])  # evenly spread: no __scatter__ samples needed
    # ndb makes some keys only inside a client's context (key arithmetic asks it for the database): the request's, or
    # else an offline client's, which sends no RPC.
    in_request = ndb.get_context(raise_context_error=False) is not None
    with contextlib.nullcontext() if in_request else _offline_client().context():
        listed = [_key(i) for i in range(1, min(entities, scan_limit(page, fanout)) + 1)]
        payload = TaskPayload("plan", "0", None, _key(entities).urlsafe().decode(), TOTAL_WEIGHT)
        handouts, ranges = split_children(job, payload, listed)
        return [len(keys) for keys in handouts], [hi.id() - lo.id() for lo, hi in ranges if lo and hi]


def fan_out(entities: int, page: int, fanout: int, chunk: int, backend: str = "firestore") -> Tree:
    """The job's tree over `entities`, cut by the mapper's own split (`split_sizes`: exact for evenly spread keys; on
    legacy the ranges are cut at __scatter__ samples, which are not even), and its critical path: the job's start, the
    longest chain of tasks (a child starts once its parent has listed its range and committed its first chunk), the
    job's end. Memoised by range size: a tree of 10**10 entities is a few dozen distinct sizes."""
    listed_most = scan_limit(page, fanout)

    def page_task(n: int) -> Tree:
        t = transactions_for(n, chunk)
        return Tree(1, 0, 0, 1, t, Calls(transactions=t, hops=1))

    @functools.cache
    def range_task(n: int) -> Tree:
        own = min(page, n)
        handed, ranges = split_sizes(n, page, fanout) if n > own else ([], [])
        children = [page_task(size) for size in handed] + [range_task(size) for size in ranges]
        t = transactions_for(own, chunk)
        listing = Calls(queries=queries_for(min(n, listed_most), listed_most, backend), hops=1)
        # Its children start once its listing and its first chunk's transaction are done.
        path = max([listing + Calls(transactions=t)] + [listing + Calls(transactions=1) + c.path for c in children],
                   key=lambda calls: calls.rpcs)
        return Tree(1 + sum(c.tasks for c in children), 1 + sum(c.range_tasks for c in children),
                    (1 if handed else 0) + sum(c.handing for c in children),
                    1 + max((c.depth for c in children), default=0),
                    t + sum(c.transactions for c in children), path)

    tree = range_task(entities)
    end = Calls(lookups=tree.depth + SETTLE_LOOKUPS, transactions=1)
    return dataclasses.replace(tree, path=job_start(entities, backend) + Calls(lookups=1) + tree.path + end)


def job_start(entities: int, backend: str) -> Calls:
    """A job's start (mapper/service.py start_job): the kind's last key, its __scatter__ samples, its transactions. The
    legacy emulator gives about half a kind's entities a __scatter__ value (measured here); Firestore's gives none."""
    samples = min(entities // 2, SAMPLES)
    return Calls(queries=1 + queries_for(samples, SAMPLES, backend), transactions=START_TRANSACTIONS)


def walk_critical_path(entities: int, page: int, chunk: int, backend: str) -> tuple[int, int]:
    """(RPCs of one cursor walk, all in turn; its queries): a keys-only query a page, a transaction a chunk. The legacy
    emulator answers a full last page "maybe more", so the walk asks once more; Firestore's says it is the last."""
    full, left = divmod(entities, page)
    queries = math.ceil(entities / page) + (1 if backend == "legacy" and not left else 0)
    transactions = full * math.ceil(page / chunk) + math.ceil(left / chunk)
    return queries + sum(figures.TRANSACTION.values()) * transactions, queries


def plan_batch(entities: int, page_size: int, fanout: int, instances: int, backend: str = "firestore",
               profile: str = "production") -> Plan:
    """A job visiting `entities` of a kind (add_credit's chunks) in pages of `page_size`: the mapper's tree, with
    `instances` tasks at once, against one cursor walk and a non-transactional batch pipeline."""
    plan = Plan("batch", {"entities": entities, "page_size": page_size, "fanout": fanout, "instances": instances,
                          "backend": backend, "profile": profile})
    for name, value, unit in (("entities", entities, "entities"), ("page size", page_size, "entities"),
                              ("fan-out", fanout, "ranges"), ("tasks at once", instances, "tasks")):
        plan.figure(name, value, unit, "yours", "")
    chunk = plan.figure("entities a transaction", CHUNKS[backend], "entities", "app",
                        f"accounts/credit.py CREDIT_CHUNK: legacy's {MAX_GROUPS} entity groups a transaction, less "
                        "the task's record" if backend == "legacy" else "accounts/credit.py ACCOUNTS_CHUNK_FIRESTORE")
    chunk = int(chunk)
    tree = fan_out(entities, page_size, fanout, chunk, backend)
    handed = len(split_sizes(entities, page_size, fanout)[0]) if entities > page_size else 0
    plan.line(f"the tree, cut by the mapper's own split over evenly spread keys: each range task lists its page and "
              f"{fanout} pages more, hands out as many of those as {HANDED_BYTES:,} bytes of keys hold (the root "
              f"{handed}, mapper/queueing.py) and splits the rest up to {fanout} ways: {tree.tasks} tasks "
              f"({tree.range_tasks} listing a range), depth {tree.depth}")
    plan.answer("depth", "Fan-out: tree depth", tree.depth, str(tree.depth))
    plan.answer("tasks", "Fan-out: tasks", tree.tasks, str(tree.tasks))
    path, start = tree.path, job_start(entities, backend)
    start_queries = plural(start.queries, "query", "queries")
    plan.line(f"its critical path: the job's start ({start_queries}, {plural(START_TRANSACTIONS, 'transaction')}: "
              f"the job and its root's record), the root's first read of the job, then down the longest "
              f"chain of {path.hops} tasks each task's listing and first transaction (its children start then), "
              f"the last one's whole page, then the job's end ({plural(tree.depth, 'read')} of the records, a level "
              f"each, and its transaction with {SETTLE_LOOKUPS} reads to settle): {path.queries} queries + "
              f"{path.lookups} lookups + 3 x {path.transactions} "
              f"transactions = {path.rpcs} RPCs")
    plan.answer("critical_rpcs", "Fan-out: critical path, RPCs", path.rpcs, f"{path.rpcs} RPCs")

    median_ms = {m: round_trip(m, profile).median_ms for m in ("RunQuery", *figures.TRANSACTION)}
    txn_ms = sum(median_ms[m] for m in figures.TRANSACTION)
    hop_ms = production_latency.TASK_CREATE.median_ms + production_latency.TASK_DELIVERY.median_ms
    for name, trip in (("Cloud Tasks create", production_latency.TASK_CREATE),
                       ("Cloud Tasks delivery", production_latency.TASK_DELIVERY)):
        plan.figure(name, trip.median_ms, "ms", "inference", production_latency.SOURCES[name])
    calls_in_turn(plan, {"RunQuery": 1, **figures.TRANSACTION}, 0, profile, "a listing and a transaction")
    queue = mapper_queue()
    plan.figure("the mapper queue's dispatch rate", queue.rate, "tasks/s", "app", "queue.yaml rate")
    concurrent = plan.figure("the mapper queue's tasks at once", queue.concurrent, "tasks", "app",
                             "queue.yaml max_concurrent_requests")
    at_once = min(instances, queue.concurrent)
    path_ms = (path.queries * median_ms["RunQuery"] + path.lookups * median_ms["Lookup"] + path.transactions * txn_ms
               + path.hops * hop_ms)
    work_ms = tree.range_tasks * median_ms["RunQuery"] + tree.transactions * txn_ms + tree.tasks * hop_ms
    dispatch_s = tree.tasks / queue.rate
    wall_s = max(path_ms / 1000, work_ms / at_once / 1000, dispatch_s)
    plan.line(f"its wall time: the longest of the critical path ({path_ms / 1000:.2f} s with each task's create and "
              f"delivery), all the work ({work_ms / 1000:.1f} s) over min({instances}, {concurrent:g} the queue "
              f"runs at once) = {at_once} tasks at once, and {tree.tasks} tasks dispatched at {queue.rate:g} a second "
              f"({dispatch_s:.2f} s) = {wall_s:.2f} s")
    read = 0 if backend == "firestore" else entities  # the job's increments: unread on Firestore (below)
    on_kind = entities + read
    plan.figure("a new kind's first operations a second", RAMP_START, "operations/s", "production", RAMP_SOURCE)
    plan.figure("then more every 5 minutes", 50, "%", "production", RAMP_SOURCE)
    ramped = ramped_seconds(on_kind, on_kind / wall_s)
    plan.line(f"on a new kind (500/50/5): its {on_kind} operations on the kind ({plural(entities, 'write')}"
              + (f" + {plural(read, 'read')}" if read else "") + f") at {on_kind / wall_s:,.0f} a second, held to "
              f"500 a second for 5 minutes and 50% more every 5 minutes after = {ramped:.2f} s")
    measured = measured_walls(MAPPER_RESULTS).get((backend, profile, page_size))
    bench = ""
    if measured and (entities, fanout) == (BENCH_ENTITIES, BENCH_FANOUT):
        for name, wall in ((f"{BENCH_WORKERS} workers in one process", measured.in_process),
                           ("local Cloud Tasks (queue.yaml) to gunicorn", measured.served)):
            plan.figure(f"the fan-out's wall time measured, {name}", wall, "s", "bench",
                        f"{MAPPER_RESULTS.relative_to(REPO)}, {measured.date}, LATENCY={profile}")
        bench = (f"; this machine's benchmark measured {measured.in_process:g} s ({BENCH_WORKERS} workers in one "
                 f"process), {measured.served:g} s (served through the local Cloud Tasks)")
    plan.answer("wall_s", "Fan-out: wall time, model medians, s", round(wall_s, 2),
                f"{wall_s:.2f} s on a kind already taking traffic; {ramped:.2f} s on a new kind (500/50/5)" + bench)

    # add_credit_increments (mapper/increments.py): on Firestore its accounts get server-side increments, unread.
    # The job's own: its start's queries and transactions, the root's read of it, its end's reads; the job and the
    # root's record written at its start, the job and the credit's shard at its end.
    job_reads, job_writes = start.queries + START_TRANSACTIONS + 1 + 1 + SETTLE_LOOKUPS, 2 + 2
    fan_bill = billing.Billed(reads=read + tree.transactions + tree.range_tasks + tree.tasks + job_reads,
                              writes=entities + tree.transactions + tree.handing + job_writes)
    plan.line(f"its bill: reads = {plural(read, 'entity', 'entities')} ("
              + ("server-side increments, unread" if backend == "firestore" else "each read in its transaction")
              + f") + {tree.transactions} record reads (one a transaction) + "
              f"{tree.range_tasks} listings + {tree.tasks} records summed at the end + {job_reads} of the job's own "
              f"(its start's {start_queries} and {plural(START_TRANSACTIONS, 'transaction')}, the root's read of it, "
              f"its end); "
              f"writes = {entities} + {tree.transactions} records + "
              f"{tree.handing} handed-out pages + {job_writes} of the job's own")
    priced(plan, fan_bill, "the fan-out is billed", once=True, answer=("fan_out_bill", "Fan-out: billed, USD a job"))

    walk, queries = walk_critical_path(entities, page_size, chunk, backend)
    walk_ms = queries * median_ms["RunQuery"] + (walk - queries) / 3 * txn_ms
    plan.line(f"one cursor walk: {queries} page queries + 3 x {(walk - queries) // 3} transactions = {walk} RPCs in "
              f"turn, {walk_ms / 1000:.1f} s at the model's medians")
    plan.answer("walk_rpcs", "One cursor walk: critical path, RPCs", walk, f"{walk} RPCs, {walk_ms / 1000:.1f} s")
    walk_bill = billing.Billed(reads=entities + queries, writes=entities)
    priced(plan, walk_bill, "the walk is billed (a keys-only page query is one read)", once=True,
           answer=("walk_bill", "One cursor walk: billed, USD a job"))

    split_query = queries_for(min(entities, PIPELINE_SAMPLES), PIPELINE_SAMPLES, backend)  # keys only: a read a batch
    pipeline = billing.Billed(reads=entities + split_query, writes=entities)
    priced(plan, pipeline, "a batch pipeline (its split query, every entity read, then written in batches, no "
           "transaction)", once=True, answer=("pipeline_bill", "Batch pipeline: billed, USD a job"))
    twice = entities // 2
    plan.line(f"the pipeline failing half way and run again credits what it had written twice: {entities} / 2 = "
              f"{twice} at least (workers in flight write more); the fan-out resumes each task from its record")
    plan.answer("pipeline_twice", "Batch pipeline failing half way: entities credited twice", twice,
                f"{twice} at least; the fan-out none")
    return plan
