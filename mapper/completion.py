"""A mapper job's progress and completion, derived from its task records: the running job's figures kept as hints in
the cache, and the job finished, exactly once, when every task has handed its credit back (the records are the truth,
the cache's running sum a hint: a check task sums the records when the cache lost some).
"""
import dataclasses
import datetime
import uuid
from typing import Any

from google.cloud import ndb

from core import clock, runtime
from core.errors import Conflict
from core.transactions import transact
from mapper import jobs
from mapper.models import TOTAL_CREDIT, MapperJob, TaskPayload, TaskRecord, summed

CHECK_HANDLER = "mapper.check"
# When the cache's running sum cannot be trusted, a check task reads the records after each of these delays (then
# every 60 s), until they add up; past MAX_CHECKS (about 2 hours) an admin finishes the job (`finish`).
CHECK_DELAYS = (1, 2, 4, 8, 15, 30)
MAX_CHECKS = 120


# A running job's figures, as the pages and the API show them while it runs, are hints kept in the cache: reading
# them is one cache round trip however many tasks the job has (summing the records, a read of every one, is for
# finishing a job). Each delivery adds what it did after committing it: a hint may fall short (a delivery that died
# before adding, a cache restart), never run ahead. Depth: one key per level reached (max over adds, no read).
HINT_LIFETIME = 7 * 86400
HINTS = ("returned", "processed", "tasks", "revived")
MAX_HINTED_DEPTH = 32  # levels of depth a hint records; a tree of 4-way splits of 100-entity pages reaches 12 by 10**9


def _key(job_id: str, name: str) -> str:
    """A job's figure in the cache: "returned" (the running sum of the credit its tasks handed back), "processed",
    "tasks", "depth" (then ":<level>")."""
    return f"mapper-{name}:{job_id}"


def _depth_key(job_id: str, level: int) -> str:
    return f"{_key(job_id, 'depth')}:{level}"


def hint(job: MapperJob, record: TaskRecord, processed_here: int, finished_here: bool) -> None:
    """After a delivery committed: add what it did to the job's hints (best effort: the cache may be away)."""
    cache = runtime.cache()
    if processed_here:
        cache.incr(_key(job.id, "processed"), processed_here)
    if finished_here:
        cache.incr(_key(job.id, "tasks"), 1)
        if record.depth < MAX_HINTED_DEPTH:
            cache.add(_depth_key(job.id, record.depth + 1), 1, expire=HINT_LIFETIME)


def hint_revived(job_id: str) -> None:
    """The sweep queued one of the job's tasks again (best effort, as every hint)."""
    runtime.cache().incr(_key(job_id, "revived"), 1)


def _hinted(job: MapperJob) -> "Status":
    """A running job's status from its hints: one cache round trip, whatever the job's size."""
    depth_keys = [_depth_key(job.id, d) for d in range(1, MAX_HINTED_DEPTH + 1)]
    found = runtime.cache().get_many([*(_key(job.id, name) for name in HINTS), *depth_keys])

    def number(name: str) -> int:
        return int(found.get(_key(job.id, name), 0))
    depth = max((d for d, key in enumerate(depth_keys, 1) if key in found), default=0)
    return Status("running", processed=number("processed"), returned=number("returned"), tasks=number("tasks"),
                  depth=depth, revived=number("revived"), estimated=True)


def start_hints(job_id: str) -> None:
    """The running sum and the hints of a job about to start, at 0."""
    for name in HINTS:
        runtime.cache().add(_key(job_id, name), 0, expire=HINT_LIFETIME)


@dataclasses.dataclass
class Status:
    state: str
    processed: int = 0
    returned: int = 0
    tasks: int = 0
    depth: int = 0
    failed: int = 0
    revived: int = 0  # tasks the sweep queued again (a task revived twice counts twice)
    tally: dict[str, int] = dataclasses.field(default_factory=dict)
    estimated: bool = False  # the figures are the cache's hints (a running job), not the records' sums

    @property
    def progress(self) -> float:
        return 1.0 if self.state == "done" else self.returned / TOTAL_CREDIT


def records(job: MapperJob, most: int | None = None) -> list[TaskRecord]:
    """The job's task records (at most `most`), walking its tree by key from the root's record, one get_multi per
    level: gets by key are strongly consistent on every backend (a query on the job's id lags on legacy Datastore,
    and could miss a record's last chunk). A record not written yet is a task whose credit is still out."""
    found: list[TaskRecord] = []
    keys = [ndb.Key(TaskRecord, f"{job.id}-0")]
    while keys and (most is None or len(found) < most):
        if most is not None:
            keys = keys[:most - len(found)]  # never read more than is asked for
        level = [record for record in ndb.get_multi(keys) if record is not None]
        found += level
        keys = [ndb.Key(TaskRecord, TaskPayload.from_json(child).name) for record in level for child in record.children]
    return found if most is None else found[:most]


def _derive(job: MapperJob) -> Status:
    """The job's state summed from its task records."""
    status = Status("running")
    for record in records(job):
        status.processed += record.processed
        status.returned += record.returned
        status.tasks += 1
        status.depth = max(status.depth, record.depth + 1)
        status.failed += record.state == "failed"
        status.revived += record.revived or 0
        status.tally = summed(status.tally, record.tally or {})
    return status


MOST_TASKS = 500  # tasks a job's timeline draws


def _path(record: TaskRecord) -> str:
    """A task's place in the tree: "0" the root, "0-2" its third child."""
    return record.key.id().split("-", 1)[1]


def _ancestors(path: str) -> set[str]:
    """The path and every task above it: "0-2-1" -> {"0", "0-2", "0-2-1"}."""
    parts = path.split("-")
    return {"-".join(parts[:n]) for n in range(1, len(parts) + 1)}


def timeline(job: MapperJob) -> dict[str, Any]:
    """The job's tasks, each from when its first delivery began to its record's last commit, in seconds from the
    job's start, with the critical path marked: the chain of tasks from the root to the one that finished last (a
    child starts once its parent's first chunk has split the range, so the job waits for that chain). At most
    MOST_TASKS, the shallowest first, and then the chain is the drawn tasks' own; `cut`: how many more the job had
    (while it runs, by its hints)."""
    shown = records(job, MOST_TASKS)
    last = max(shown, key=lambda record: record.updated, default=None)
    critical = _ancestors(_path(last)) if last else set()
    tasks = []
    for record in shown:
        name = _path(record)
        tasks.append({"task": name, "depth": record.depth, "processed": record.processed, "state": record.state,
                      "start_s": round(((record.started or record.updated) - job.created).total_seconds(), 3),
                      "end_s": round((record.updated - job.created).total_seconds(), 3),
                      "critical": name in critical, "revived": record.revived or 0})
    # a running job's tasks so far from its hints, which may fall short
    made = (job.summary or {}).get("tasks", len(shown)) if job.finished else _hinted(job).tasks
    return {"tasks": tasks, "cut": max(made - len(shown), 0), "most_tasks": MOST_TASKS}


def maybe_finish(job: MapperJob, returned: int) -> None:
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
    total = runtime.cache().incr(_key(job.id, "returned"), returned) if returned else None
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
    finish, one does it, and its own retry after a commit of unknown outcome finds it finished by itself (and so still
    queues its follow-up; what was to follow that commit, a settled counter's cached total dropped, did not run: that
    total corrects itself when its cached copy expires). The same commit marks the job's on_done pending
    (`mark_ended`): a process that dies after it leaves the follow-up to the sweep. `status`: the records' sums,
    every credit back (no chunk can commit after that)."""
    definition = jobs.of(job)
    call = uuid.uuid4().hex

    def txn() -> MapperJob | None:
        current = job.key.get(retries=0)
        if current.finished:
            return current if current.finished_by == call else None
        current.finished_by = call
        mark_ended(current, _outcome(current, status) or "done",
                   {"processed": status.processed, "tasks": status.tasks, "depth": status.depth,
                    "tally": status.tally, "revived": status.revived})
        settled = definition.settle(status.tally, current.params) if definition and definition.settle else []
        ndb.put_multi([current, *settled])
        return current
    done = transact(txn, hot_key=job.key)
    if done is not None:
        follow_up(done)
    return done


# --- the job's follow-up (JobDefinition.on_done): exactly once, by a task the sweep queues again until it ran --------

DONE_HANDLER = "mapper.done"


def mark_ended(job: MapperJob, outcome: str, summary: dict[str, Any]) -> None:
    """Write the job's end into `job` (the caller puts it, in the commit that finishes the job): its outcome and
    figures, and its on_done pending when it has one, due within a lease (else the sweep queues it again)."""
    job.finished, job.outcome, job.summary = clock.now(), outcome, summary
    definition = jobs.of(job)
    if definition and definition.on_done:
        job.follow_up = "pending"
        job.follow_up_due = job.finished + datetime.timedelta(seconds=runtime.current().settings.mapper_lease_seconds)


def follow_up(job: MapperJob) -> None:
    """After the finishing commit: queue the task that runs the job's on_done (a no-op for a job without one). The
    name makes a repeat of this call one task; the sweep's later sends have names of their own (`follow_up_sent`)."""
    if job.follow_up == "pending":
        runtime.tasks().enqueue(DONE_HANDLER, {"job": job.id}, f"{job.id}-done-{job.follow_up_sent}")


def run_follow_up(payload: dict[str, Any], attempt: int = 0) -> dict[str, Any]:
    """The follow-up task: run the job's on_done and commit what it returns together with the mark that it ran, so
    its writes land exactly once however often this task is delivered (by the queue, or queued again by the sweep).
    on_done runs outside the transaction (it may read what a transaction may not: a query, a counter's shards)."""
    job = MapperJob.get_by_id(payload["job"], use_cache=False, use_global_cache=False)
    definition = jobs.of(job) if job else None
    if job is None or job.follow_up != "pending" or definition is None or definition.on_done is None:
        return {"skipped": "no follow-up pending"}
    writes = definition.on_done(job) or []
    call = uuid.uuid4().hex

    def txn() -> bool:
        current = job.key.get(retries=0)
        if current.follow_up == "ran":
            return current.follow_up_by == call  # by this call, whose commit answered UNKNOWN: it did run
        current.follow_up, current.follow_up_by = "ran", call
        ndb.put_multi([current, *writes])
        return True
    return {"ran": transact(txn, hot_key=job.key)}


def status(job: MapperJob) -> Status:
    """The job's state and figures, read only: a finished job answers from itself (the records' sums, exact), a running
    or cancelled one from its hints (`_hinted`: no read that grows with its tasks, however often the pages poll)."""
    if job.finished:  # every task had handed its credit back
        return Status(job.outcome, returned=TOTAL_CREDIT, **(job.summary or {}))
    current = _hinted(job)
    if job.cancelled:
        current.state = "cancelled"
    return current


def finish(job: MapperJob) -> MapperJob:
    """Finish a running job whose tasks have all reported back (every credit returned, or one failed for good) but
    that was not marked finished: its last task died before noticing, or could not see every record. Conflict while
    ranges are still out."""
    if job.finished:
        return job
    current = _derive(job)
    if _outcome(job, current) is None:
        raise Conflict(f"The job is still running: {current.progress:.0%} of its key range has reported back.",
                       "job_running")
    return _finalize(job, current) or job.key.get()


