"""The adaptive-sharding mapper: visit every entity of a kind with a tree of tasks split by key range.

A task fetches one page of its key range (keys only, in key order) and, if keys remain after the page, splits the rest
of its range into `fanout` ranges, each a new task started at once; then it processes its page in transactions of a
few entities. The tree is O(log N) deep and keeps as many workers busy as the queue has. Never limit+offset: an
offset query reads and skips every entity before the page, so walking N entities that way reads O(N^2)
(bench/mapper.py measures it).

Exactly once: each chunk's writes and the task's record (how far its page got) commit in one transaction, so a task
that dies half way is retried from where its record says, and a second delivery of the same task finds the record
moved on and steps back. The record keeps the children it split into from its first chunk on; a retry enqueues those
same named tasks again, which every queue ignores (core/tasks.py), so a retry never splits twice.

No hot entity: a chunk's transaction writes its entities and its own task's record, nothing another task writes, so
concurrent tasks never collide with each other. What a job adds up over its entities (its tally: a credit job's total
credit) is kept in each task's record and summed once, when the last credit comes back, in the transaction that
marks the job finished (`settle`): the talk's sharded counter, with one shard per task.

Jobs are defined by name (a JobDefinition), by the feature that owns the kind, from its init_app
(`register(app, JobDefinition(...))`): each app keeps its own (on its runtime). A run of one is a MapperJob; its tasks
carry the run's id (TaskPayload), never code.
"""
import dataclasses
import functools
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any

from flask import Flask
from google.cloud import ndb

from core import clock, runtime, tasks
from core.errors import BadInput, Conflict, found
from core.transactions import transact
from core.validate import whole_number
from mapper import keyrange
from mapper.models import TOTAL_CREDIT, MapperJob, Page, TaskPayload, TaskRecord, summed

log = logging.getLogger(__name__)

KEY = ndb.model.ModelKey()  # the __key__ pseudo-property, for filters and sort orders on keys
TASK_HANDLER = "mapper.run"
CHECK_HANDLER = "mapper.check"
# When the cache's running sum cannot be trusted, a check task reads the records after each of these delays (then
# every 60 s), until they add up; past MAX_CHECKS (about 2 hours) an admin finishes the job (finish_job).
CHECK_DELAYS = (1, 2, 4, 8, 15, 30)
MAX_CHECKS = 120
JOB_ID_PATTERN = re.compile(r"[0-9a-f]{16}")
SAMPLES = 512  # __scatter__ keys read when a job starts: a few per final range of a tree of ~100 tasks
MAX_PAGE_SIZE = 500
LIST_LIMIT = 20
# The emulator (like Datastore before Firestore) refuses a transaction over more than 25 entity groups; a chunk's
# entities plus the task's record must fit, with room for what a job writes beside each entity.
MAX_GROUPS = 25


@dataclasses.dataclass(frozen=True)
class JobDefinition:
    """A job that can be run over every entity of `kind` (each run of it: a MapperJob).

    `apply(entities, params, prepared)` runs inside the chunk's transaction with the chunk's entities as read in it,
    and returns the entities to write. `prepare(keys, params)`, if given, runs before, outside any transaction, for
    what a transaction may not do (queries without an ancestor); its result is passed to apply.
    `chunk` entities per transaction: at most MAX_GROUPS - 1 - the groups apply writes beside them.
    `tally(entities, params)`, if given, returns whole numbers by name ({"count": 3, "balance": 30}); they are added
    to the task's record in the chunk's transaction, so each entity counts exactly once, and the job's tally is their
    sum over its records (the reduce after the map): sums over every entity with no shared entity and no scan.
    `settle(tally, params)`, if given, returns entities to write in the transaction that marks the job finished (done,
    failed or cancelled), exactly once: where a job's effect on figures kept elsewhere lands, after every chunk has
    committed, instead of each chunk writing one shared entity.
    """
    name: str
    kind: str
    title: str
    description: str
    apply: Callable[[list, dict, Any], list]
    parse_params: Callable[[dict], dict] = lambda params: _no_params(params)
    prepare: Callable[[list, dict], Any] | None = None
    on_done: Callable[[MapperJob], None] | None = None
    tally: Callable[[list, dict], dict] | None = None
    settle: Callable[[dict, dict], list] | None = None
    fields: tuple = ()  # (name, label, default) of each param, for the jobs page's form
    chunk: int = 20
    page_size: int = 100
    fanout: int = 4


JOBS = "mapper.jobs"  # the runtime's registry of this app's jobs by name


def _no_params(params: dict[str, Any]) -> dict[str, Any]:
    if params:
        raise BadInput("This job takes no params.", "bad_params")
    return {}


def register(app: Flask, definition: JobDefinition) -> JobDefinition:
    """Make the job `definition` one that `app` can run (from the init_app of the feature that owns its kind)."""
    if not 1 <= definition.chunk < MAX_GROUPS:
        raise ValueError(f"{definition.name}: a chunk of {definition.chunk} does not fit a transaction")
    jobs = runtime.of(app).registry(JOBS)
    if definition.name in jobs:
        raise ValueError(f"a job named {definition.name!r} is registered already")
    jobs[definition.name] = definition
    return definition


def _jobs() -> dict[str, JobDefinition]:
    return runtime.current().registry(JOBS)


def registered() -> dict[str, JobDefinition]:
    return dict(sorted(_jobs().items()))


def definition_of(name: object) -> JobDefinition:
    jobs = _jobs()
    if not isinstance(name, str) or name not in jobs:
        raise BadInput(f"There is no job named {name!r}; known: {', '.join(sorted(jobs))}.", "no_such_job")
    return jobs[name]


class Superseded(Exception):
    """Another delivery of the same task moved its record on: this one must stop and let the queue try later."""


# --- starting ------------------------------------------------------------------------------------------------------

def start_job(name: object, params: object = None, page_size: object = None, fanout: object = None) -> MapperJob:
    """Check the job and its params, note the kind's range and samples, enqueue the root task; the MapperJob."""
    definition = definition_of(name)
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadInput("params must be a JSON object.", "bad_params")
    params = definition.parse_params(params)
    page_size = whole_number(page_size, "page_size", 1, MAX_PAGE_SIZE, default=definition.page_size)
    fanout = whole_number(fanout, "fanout", 2, 16, default=definition.fanout)

    query = ndb.Query(kind=definition.kind)
    # The root range ends at the kind's largest key (none: the kind is empty). A descending key order needs a
    # composite index per kind (index.yaml), in production as in the emulator.
    last = query.order(-KEY).fetch(1, keys_only=True)
    samples = query.order(ndb.GenericProperty("__scatter__")).fetch(SAMPLES, keys_only=True) if last and SAMPLES else []
    job = MapperJob(id=secrets.token_hex(8), name=name, params=params, kind=definition.kind, page_size=page_size,
                    fanout=fanout, last_key=last[0] if last else None, samples=sorted(samples, key=keyrange.order))
    if not last:  # nothing to visit: done at once
        job.finished, job.outcome, job.summary = clock.now(), "done", {"processed": 0, "tasks": 0, "depth": 0}
        job.put()
        _finished(job)
        return job
    job.put()
    for key in (_returned_key(job.id), *_hint_keys(job.id).values()):
        runtime.cache().add(key, 0, expire=HINT_LIFETIME)
    _enqueue(TaskPayload(job.id, "0", None, job.last_key.urlsafe().decode(), TOTAL_CREDIT))
    return job


def _enqueue(payload: TaskPayload) -> None:
    runtime.tasks().enqueue(TASK_HANDLER, payload.to_json(), payload.name)


def _returned_key(job_id: str) -> str:
    return f"mapper-returned:{job_id}"


# A running job's figures, as the pages and the API show them while it runs, are hints kept in the cache: reading
# them is one cache round trip however many tasks the job has (summing the records, a query over every one, is for
# finishing a job). Each delivery adds what it did after committing it: a hint may fall short (a delivery that died
# before adding, a cache restart), never run ahead. Depth: one key per level reached (max over adds, no read).
HINT_LIFETIME = 7 * 86400
MAX_HINTED_DEPTH = 32  # levels of depth a hint records; a tree of 4-way splits of 100-entity pages reaches 12 by 10**9


def _hint_keys(job_id: str) -> dict[str, str]:
    return {"processed": f"mapper-processed:{job_id}", "tasks": f"mapper-tasks:{job_id}"}


def _depth_key(job_id: str, depth: int) -> str:
    return f"mapper-depth:{job_id}:{depth}"


def _hint(job: MapperJob, record: TaskRecord, processed_here: int, finished_here: bool) -> None:
    """After a delivery committed: add what it did to the job's hints (best effort: the cache may be away)."""
    cache, keys = runtime.cache(), _hint_keys(job.id)
    if processed_here:
        cache.incr(keys["processed"], processed_here)
    if finished_here:
        cache.incr(keys["tasks"], 1)
        if record.depth < MAX_HINTED_DEPTH:
            cache.add(_depth_key(job.id, record.depth + 1), 1, expire=HINT_LIFETIME)


def _hinted(job: MapperJob) -> "Status":
    """A running job's status from its hints: one cache round trip, whatever the job's size."""
    keys = _hint_keys(job.id)
    depth_keys = [_depth_key(job.id, d) for d in range(1, MAX_HINTED_DEPTH + 1)]
    found = runtime.cache().get_many([_returned_key(job.id), *keys.values(), *depth_keys])

    def number(key: str) -> int:
        return int(found.get(key, 0))
    depth = max((d for d, key in enumerate(depth_keys, 1) if key in found), default=0)
    return Status("running", processed=number(keys["processed"]), returned=number(_returned_key(job.id)),
                  tasks=number(keys["tasks"]), depth=depth, estimated=True)


# --- one task --------------------------------------------------------------------------------------------------------

def run_task(body: dict[str, Any], attempt: int = 0) -> dict[str, Any]:
    """One task of a job's tree (delivered by a queue, at least once). Returns what it did."""
    payload = TaskPayload.from_json(body)
    job = MapperJob.get_by_id(payload.job)
    if job is None or job.finished:
        return {"skipped": "the job is gone or finished"}
    definition = _jobs().get(job.name)
    record_key = ndb.Key(TaskRecord, payload.name)
    if job.cancelled:
        # The rest of this task's range is left unvisited and its credit handed back, so that the job still ends and
        # settles what its tasks did before the cancel.
        record, returned_here = _hand_back(record_key, payload, "done")
    else:
        record, returned_here = _run(job, definition, record_key, payload, attempt)
    if record.returned:
        # Only the delivery that finished the record adds its credit to the running sum. Any other delivery of a
        # finished record (attempt 1+) cannot know whether the one that finished it lived to add it: 0 here, and
        # _maybe_finish then trusts the records over the sum.
        _maybe_finish(job, returned_here)
    return {"processed": record.processed, "children": len(record.children)}


def _run(job: MapperJob, definition: JobDefinition | None, record_key: ndb.Key, payload: TaskPayload,
         attempt: int) -> tuple[TaskRecord, int]:
    """This delivery's work on its task: (the record as it left it, the credit it returned)."""
    # A first delivery (attempt 0) does not look for its record: its first chunk's transaction writes it, and finds
    # it there if another delivery got there first (then this one steps back and is retried as attempt 1+, which
    # reads the record first). One lookup fewer per task.
    record = (record_key.get() if attempt else None) or TaskRecord.new(record_key, payload)
    if record.state != "running":
        _enqueue_children(record)  # the delivery that finished it may have died before enqueueing them
        return record, 0  # only the delivery that finished the record returned its credit
    try:
        if definition is None:
            raise RuntimeError(f"job {job.name!r} is not registered in this version of the app")
        processed_before = record.processed
        record = _process(job, definition, record, payload)
        _hint(job, record, record.processed - processed_before, record.state == "done")
        return record, record.returned
    except Superseded:
        raise Conflict("Another delivery of this task is running it; try later.", "superseded") from None
    except Exception as e:
        if attempt + 1 < tasks.MAX_ATTEMPTS:
            raise
        log.exception("mapper task %s failed for good", record_key.id())
        return _hand_back(record_key, payload, "failed", f"{type(e).__name__}: {e}"[:2000])


def _page_query(kind: str, after: ndb.Key | None, upto: ndb.Key) -> ndb.Query:
    query = ndb.Query(kind=kind).filter(KEY <= upto)
    if after is not None:
        query = query.filter(KEY > after)
    return query.order(KEY)


def _process(job: MapperJob, definition: JobDefinition, record: TaskRecord, payload: TaskPayload) -> TaskRecord:
    """Process this task's page in chunks; the final record.

    The page's first chunk also records the tasks the rest of the range splits into, and they are enqueued as soon
    as it commits, while this task goes on with its page: the tree grows one page query and one commit per level,
    not one whole page per level, so a job's critical path (the RPCs that must follow one another) is its depth in
    short steps plus one page. Each task keeps a share of its credit for its own page and hands the rest to its
    children: the credit comes back whole only when every page, the splitters' own included, is done."""
    hi = payload.hi_key
    resume = record.last_key or payload.lo_key
    page = record.page
    if page is None:  # first delivery: fix the page (one more key says whether any remain)
        keys = _page_query(job.kind, resume, hi).fetch(job.page_size + 1, keys_only=True)
        keys, more = keys[:job.page_size], len(keys) > job.page_size
        page = Page(keys[0], keys[-1], more) if keys else Page(None, None, False)
    else:  # a retry: the rest of the page its first delivery fixed
        keys = _page_query(job.kind, resume, page.end).fetch(job.page_size, keys_only=True)
    children = _split(job, payload, page, hi, record.credit) if page.more and record.page_end is None else []
    prepared = definition.prepare(keys, job.params) if definition.prepare else None
    chunks = [keys[i:i + definition.chunk] for i in range(0, len(keys), definition.chunk)] or [[]]

    def txn(chunk: list[ndb.Key], expected: ndb.Key | None, final: bool) -> TaskRecord:
        # One lookup for the record and the chunk: entities no other task's transaction touches (each task has its
        # own key range and its own record), so chunks of concurrent tasks never collide.
        current, *entities = ndb.get_multi([record.key] + chunk)
        if current is None and not expected and record.page_end is None:  # no delivery has written it yet
            current = TaskRecord.new(record.key, payload)
        elif current is None or current.state != "running" or current.last_key != expected:
            raise Superseded()
        entities = [e for e in entities if e is not None]  # deleted since the query: skipped
        writes = definition.apply(entities, job.params, prepared) if entities else []
        tally = definition.tally(entities, job.params) if definition.tally and entities else None
        current.advance(page, chunk, len(entities), tally, children, final)
        ndb.put_multi([*writes, current])
        return current

    for number, chunk in enumerate(chunks):
        record = transact(functools.partial(txn, chunk, record.last_key, number == len(chunks) - 1))
        if number == 0:  # the split is recorded (by this delivery or an earlier one): the children start now
            _enqueue_children(record)
    return record


def _enqueue_children(record: TaskRecord) -> None:
    """Enqueue the tasks `record` split into; a repeat (a retry's) is dropped by the queue, which knows their names."""
    for child in record.children:
        _enqueue(TaskPayload.from_json(child))


def _split(job: MapperJob, payload: TaskPayload, page: Page, hi: ndb.Key, credit: int) -> list[TaskPayload]:
    """The payloads of the tasks the rest of the range (page.end, hi] splits into; one child when it cannot split.
    Each child gets an equal share of `credit`, and the task keeps one share and the remainder for its own page.
    Depends only on what every delivery of the task sees alike (the page it fixed was full, since keys remained, and
    its ends are in the record), so a retry splits exactly as the first delivery did."""
    parts = keyrange.parts_needed(payload.lo_key, page.end, hi, job.page_size, job.page_size, job.fanout,
                                  job.samples)
    points = keyrange.split_points(page.end, hi, parts, job.samples, page.start) if parts > 1 else []
    bounds = [page.end] + points + [hi]
    count = len(bounds) - 1
    share = credit // (count + 1)
    if share == 0:  # credit too finely divided to split further (never at these depths): one child, half of it
        bounds, count, share = [page.end, hi], 1, credit // 2
    return [payload.child(i, bounds[i], bounds[i + 1], share) for i in range(count)]


def _hand_back(record_key: ndb.Key, payload: TaskPayload, state: str,
               error: str | None = None) -> tuple[TaskRecord, int]:
    """End a task's record without visiting the rest of its page (its job is cancelled, or the task failed for good):
    `state`, and the credit it kept for its page returned, so the job still ends when every other task has. What its
    chunks committed before stays in the record's tally; children it recorded are enqueued (again: a delivery may
    have died before it did) and return their own credit. (the record, the credit this call returned: 0 when another
    delivery ended the record first)."""
    def txn() -> tuple[TaskRecord, int]:
        record = record_key.get(retries=0) or TaskRecord.new(record_key, payload)
        if record.state != "running":
            return record, 0
        record.state, record.error = state, error
        record.returned = record.kept_credit
        record.put()
        return record, record.returned
    record, returned = transact(txn)
    _enqueue_children(record)
    return record, returned


# --- state, progress and completion, all derived from the task records ------------------------------------------

@dataclasses.dataclass
class Status:
    state: str
    processed: int = 0
    returned: int = 0
    tasks: int = 0
    depth: int = 0
    failed: int = 0
    tally: dict[str, int] = dataclasses.field(default_factory=dict)
    estimated: bool = False  # the figures are the cache's hints (a running job), not the records' sums

    @property
    def progress(self) -> float:
        return 1.0 if self.state == "done" else self.returned / TOTAL_CREDIT


def _derive(job: MapperJob) -> Status:
    """Sum the job's task records, walking its tree by key from the root's record, one get_multi per level: gets by
    key are strongly consistent on every backend (a query on the job's id lags on legacy Datastore, and could sum a
    record before its last chunk). A record not written yet is a task whose credit is still out."""
    status = Status("running")
    keys = [ndb.Key(TaskRecord, f"{job.id}-0")]
    while keys:
        children: list[ndb.Key] = []
        for record in ndb.get_multi(keys):
            if record is None:
                continue
            status.processed += record.processed
            status.returned += record.returned
            status.tasks += 1
            status.depth = max(status.depth, record.depth + 1)
            status.failed += record.state == "failed"
            status.tally = summed(status.tally, record.tally or {})
            children += [ndb.Key(TaskRecord, TaskPayload.from_json(child).name) for child in record.children]
        keys = children
    return status


def _maybe_finish(job: MapperJob, returned: int) -> None:
    """After a task returned credit: finish the job if every credit is back. The cache keeps a running sum so that
    only the last task pays for summing the records (reading every one); the records are the truth, the sum a hint.

    `returned` is what this delivery adds to the sum: the credit of the record it finished, 0 from any other delivery
    of that record. At-least-once queues deliver a task again, and a sum that counted each delivery would say "every
    credit is back" while ranges were still out (and past 2**64 memcached's incr wraps to a small number).

    The sum can be trusted only while the cache answered every incr: it is missing (`None`: the cache is down,
    restarted or flushed, or evicted it), or short for good when a delivery died between committing its record and
    adding its credit (the queue's redelivery then comes here with 0). Either way this task sums the records itself,
    and if they do not add up yet, a check task (`run_check`) sums them again later until they do. So the job
    finishes however much the cache lost, and the cost of that falls only on jobs where something was lost.

    The records are read by key (`_derive`), so when they do not add up, a credit is really still out.
    """
    total = runtime.cache().incr(_returned_key(job.id), returned) if returned else None
    if total is not None and total < TOTAL_CREDIT:
        return  # ranges are still out, by a sum this delivery has just added its own credit to
    current = _derive(job)
    if _outcome(job, current):
        _finalize(job, current)
    else:
        _check_later(job.id, 1)


def _outcome(job: MapperJob, status: Status) -> str | None:
    """How a job ends once every task has handed its credit back: "failed" if one failed for good, "cancelled" if it
    was, else "done"; None while ranges are still out."""
    if status.returned != TOTAL_CREDIT:
        return None
    return "failed" if status.failed else "cancelled" if job.cancelled else "done"


def _check_later(job_id: str, number: int) -> None:
    """Enqueue the job's check task `number` (its name makes every caller's enqueue of it one task)."""
    delay = CHECK_DELAYS[number - 1] if number <= len(CHECK_DELAYS) else 60
    runtime.tasks().enqueue(CHECK_HANDLER, {"job": job_id, "check": number}, f"{job_id}-check-{number}", delay=delay)


def run_check(payload: dict[str, Any], attempt: int = 0) -> dict[str, Any]:
    """A check task: finish the job if its records add up (or one failed for good), else check again later."""
    job = MapperJob.get_by_id(payload["job"])
    if job is None or job.finished:  # a cancelled job still ends (its tasks hand their ranges back)
        return {"skipped": "the job is gone or finished"}
    current = _derive(job)
    if _outcome(job, current):
        finished = _finalize(job, current)
        return {"finished": (finished or job.key.get()).outcome}
    if payload["check"] < MAX_CHECKS:
        _check_later(job.id, payload["check"] + 1)
    return {"progress": round(current.progress, 4)}


def _finalize(job: MapperJob, status: Status) -> MapperJob | None:
    """Mark the job finished, once, with its outcome as the job stands in this transaction (a cancel may have come
    since the caller read it), and settle its tally (JobDefinition.settle) in the same transaction: of all who see it
    finish, one does it, and a retry after a commit of unknown outcome finds it finished. `status`: the records'
    sums, every credit back (no chunk can commit after that)."""
    definition = _jobs().get(job.name)

    def txn() -> MapperJob | None:
        current = job.key.get(retries=0)
        if current.finished:
            return None
        current.finished, current.outcome = clock.now(), _outcome(current, status)
        current.summary = {"processed": status.processed, "tasks": status.tasks, "depth": status.depth,
                           "tally": status.tally}
        settled = definition.settle(status.tally, current.params) if definition and definition.settle else []
        ndb.put_multi([current, *settled])
        return current
    finished = transact(txn, hot_key=job.key)
    if finished is not None:
        _finished(finished)
    return finished


def _finished(job: MapperJob) -> None:
    definition = _jobs().get(job.name)
    if definition and definition.on_done:
        definition.on_done(job)


def status(job: MapperJob) -> Status:
    """The job's state and figures, read only: a finished job answers from itself (the records' sums, exact), a running
    or cancelled one from its hints (`_hinted`: no read that grows with its tasks, however often the pages poll)."""
    if job.finished:  # every task had handed its credit back
        return Status(job.outcome, returned=TOTAL_CREDIT, **(job.summary or {}))
    current = _hinted(job)
    if job.cancelled:
        current.state = "cancelled"
    return current


def finish_job(job_id: object) -> MapperJob:
    """Admin: finish a running job whose tasks have all reported back (every credit returned, or one failed for good)
    but that was not marked finished: its last task died before noticing, or could not see every record. Conflict
    while ranges are still out."""
    job = get_job(job_id)
    if job.finished:
        return job
    current = _derive(job)
    if _outcome(job, current) is None:
        raise Conflict(f"The job is still running: {current.progress:.0%} of its key range has reported back.",
                       "job_running")
    return _finalize(job, current) or job.key.get()


def job_dict(job: MapperJob) -> dict[str, Any]:
    s = status(job)
    end = job.finished or clock.now()
    return {"id": job.id, "name": job.name, "params": job.params, "state": s.state, "processed": s.processed,
            "progress": round(s.progress, 4), "tasks": s.tasks, "depth": s.depth, "fanout": job.fanout,
            "page_size": job.page_size, "created": clock.iso(job.created), "tally": s.tally,
            "estimated": s.estimated, "elapsed": round((end - job.created).total_seconds(), 1)}


def get_job(job_id: object) -> MapperJob:
    if not isinstance(job_id, str) or not JOB_ID_PATTERN.fullmatch(job_id):
        raise BadInput("A job id is 16 hex digits.", "bad_job_id")
    return found(MapperJob.get_by_id(job_id), f"There is no job {job_id}.", "no_such_job")


def list_jobs(limit: int = LIST_LIMIT) -> list[MapperJob]:
    return MapperJob.query().order(-MapperJob.created).fetch(limit)


def cancel_job(job_id: object) -> MapperJob:
    """Stop a running job: tasks not yet run skip it. Entities already processed stay processed."""
    key = get_job(job_id).key

    def txn() -> MapperJob:
        job = key.get(retries=0)
        if job.finished:
            raise Conflict("The job has finished already.", "job_finished")
        job.cancelled = True
        job.put()
        return job
    # In turn with the job's other writers: the task that finishes it (_finalize) and another admin's cancel.
    return transact(txn, hot_key=key)
