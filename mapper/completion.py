"""A mapper job's progress (hints in the cache) and its end, exactly once, when every task has handed its weight back
(the records are the truth, the cache's running sum a hint); then its on_done, once. Why: docs/lessons/mapper.md.
Weight-throwing termination detection: S.-T. Huang, "Detecting termination of distributed computations by external
agents", ICDCS 1989; recovery: F. Mattern, "Global quiescence detection based on credit distribution and recovery",
Information Processing Letters 30(4), 1989 (what he calls credit, this app calls weight)."""
import dataclasses
import datetime
from typing import Any

from google.cloud import ndb

from core import clock, errors, runtime
from core.errors import Conflict
from core.exactly_once import Written, once
from mapper import jobs
from mapper.models import MapperJob
from mapper.task import TOTAL_WEIGHT, TaskPayload, TaskRecord, summed

CHECK_HANDLER = "mapper.check"
# When the cache's running sum cannot be trusted, a check task reads the records after each of these delays (then
# every 60 s), until they add up; past MAX_CHECKS (about 2 hours) an admin ends the job (`end_by_admin`).
CHECK_DELAYS = (1, 2, 4, 8, 15, 30)
MAX_CHECKS = 120


# A running job's figures are hints in the cache, one round trip however many tasks it has (summing the records is
# for ending a job). Each delivery adds after its commit: a hint may fall short, never run ahead.
HINT_LIFETIME = 7 * 86400
HINTS = ("returned", "processed", "tasks", "revived")
MAX_HINTED_DEPTH = 32  # levels of depth a hint records; a tree of 4-way splits of 100-entity pages reaches 12 by 10**9


def _key(job_id: str, name: str) -> str:
    """A job's figure in the cache ("returned": the running sum of the weight its tasks handed back)."""
    return f"mapper-{name}:{job_id}"


def _depth_key(job_id: str, level: int) -> str:
    return f"{_key(job_id, 'depth')}:{level}"


def hint(job: MapperJob, record: TaskRecord, processed_here: int, ended_here: bool) -> None:
    """After a delivery committed: add what it did to the job's hints (best effort: the cache may be away)."""
    cache = runtime.cache()
    if processed_here:
        cache.incr(_key(job.id, "processed"), processed_here)
    if ended_here:
        cache.incr(_key(job.id, "tasks"), 1)
        if record.depth < MAX_HINTED_DEPTH:
            cache.add(_depth_key(job.id, record.depth + 1), 1, expire=HINT_LIFETIME)


def hint_revived(job_id: str) -> None:
    """The sweep queued one of the job's tasks again (best effort, as every hint)."""
    runtime.cache().incr(_key(job_id, "revived"), 1)


def _hinted(job: MapperJob) -> "Figures":
    """A running job's figures from its hints: one cache round trip, whatever the job's size."""
    depth_keys = [_depth_key(job.id, d) for d in range(1, MAX_HINTED_DEPTH + 1)]
    found = runtime.cache().get_many([*(_key(job.id, name) for name in HINTS), *depth_keys])
    hinted: dict[str, Any] = {name: int(found.get(_key(job.id, name), 0)) for name in HINTS}
    depth = max((d for d, key in enumerate(depth_keys, 1) if key in found), default=0)
    return Figures("running", **hinted, depth=depth, estimated=True)


def start_hints(job_id: str) -> None:
    for name in HINTS:
        runtime.cache().add(_key(job_id, name), 0, expire=HINT_LIFETIME)


@dataclasses.dataclass
class Figures:
    """A job's state ("running", or its outcome) and its figures: summed from its records, or its hints."""
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
        return 1.0 if self.state == "done" else self.returned / TOTAL_WEIGHT


def records(job: MapperJob, most: int | None = None) -> list[TaskRecord]:
    """The job's task records (at most `most`), walking its tree by key from the root's record, one get_multi per
    level: gets by key are strongly consistent on every backend (a query on the job's id lags on legacy Datastore,
    and could miss a record's last chunk). A record not written yet is a task whose weight is still out."""
    found: list[TaskRecord] = []
    keys = [ndb.Key(TaskRecord, f"{job.id}-0")]
    while keys and (most is None or len(found) < most):
        if most is not None:
            keys = keys[:most - len(found)]  # never read more than is asked for
        level = [record for record in ndb.get_multi(keys) if record is not None]
        found += level
        keys = [ndb.Key(TaskRecord, TaskPayload.from_json(child).name) for record in level for child in record.children]
    return found if most is None else found[:most]


def _summed(job: MapperJob) -> Figures:
    sums = Figures("running")
    for record in records(job):
        sums.processed += record.processed
        sums.returned += record.returned
        sums.tasks += 1
        sums.depth = max(sums.depth, record.depth + 1)
        sums.failed += record.state == "failed"
        sums.revived += record.revived or 0
        sums.tally = summed(sums.tally, record.tally or {})
    return sums


MOST_TASKS = 500  # tasks a job's timeline draws


def _path(record: TaskRecord) -> str:
    """A task's place in the tree: "0" the root, "0-2" its third child."""
    return record.key.id().split("-", 1)[1]


def timeline(job: MapperJob) -> dict[str, Any]:
    """The job's tasks (first delivery's start to last commit, in seconds from the job's start), the critical path
    marked: the chain from the root to the task that finished last. At most MOST_TASKS, the shallowest first; `cut`:
    how many more the job had."""
    shown = records(job, MOST_TASKS)
    last = max(shown, key=lambda record: record.updated, default=None)
    parts = _path(last).split("-") if last else []
    critical = {"-".join(parts[:n]) for n in range(1, len(parts) + 1)}  # "0-2-1": "0", "0-2" and "0-2-1"
    tasks = [{"task": _path(record), "depth": record.depth, "processed": record.processed, "state": record.state,
              "start_s": round(((record.started or record.updated) - job.created).total_seconds(), 3),
              "end_s": round((record.updated - job.created).total_seconds(), 3),
              "critical": _path(record) in critical, "revived": record.revived or 0} for record in shown]
    made = (job.summary or {}).get("tasks", len(shown)) if job.ended else _hinted(job).tasks  # hints may fall short
    return {"tasks": tasks, "cut": max(made - len(shown), 0), "most_tasks": MOST_TASKS}


def end_if_all_back(job: MapperJob, passed_on: int) -> None:
    """After a task returned weight (`passed_on`: what this delivery adds to the running sum, 0 but from the delivery
    that ended the record): the add that completes the sum reads the records, once a job. With no sum to add to (the
    cache lost it) or nothing to add, check tasks read them: a task end reading them all is quadratic in the tasks."""
    total = runtime.cache().incr(_key(job.id, "returned"), passed_on) if passed_on else None
    if total is not None and total < TOTAL_WEIGHT:
        return  # ranges are still out, by a sum this delivery has just added its own weight to
    if total is None:
        _check_later(job.id, 1)  # named: every task end of the job queues this one check
        return
    end_if_summed(job)


def end_if_summed(job: MapperJob) -> None:
    """Sum the job's records (a read of every one) and end it if all the weight is back, else check again later."""
    sums = _summed(job)
    if _outcome(job, sums):
        _end(job, sums)
    else:
        _check_later(job.id, 1)


def _outcome(job: MapperJob, sums: Figures) -> str | None:
    """How a job ends once all the weight is back ("failed", "cancelled", "done"); None while ranges are out."""
    if sums.returned != TOTAL_WEIGHT:
        return None
    return "failed" if sums.failed else "cancelled" if job.cancelled else "done"


def _check_later(job_id: str, number: int) -> None:
    """Enqueue the job's check task `number` (its name makes every caller's enqueue of it one task)."""
    delay = CHECK_DELAYS[number - 1] if number <= len(CHECK_DELAYS) else 60
    runtime.tasks().enqueue(CHECK_HANDLER, {"job": job_id, "check": number}, f"{job_id}-check-{number}", delay=delay)


def run_check(payload: dict[str, Any], delivery: int = 0) -> dict[str, Any]:
    """A check task: end the job if its records add up (or one failed for good), else check again later."""
    job = MapperJob.get_by_id(payload["job"])
    if job is None or job.ended:  # a cancelled job still ends (its tasks hand their ranges back)
        return {"skipped": "the job is gone or has ended"}
    sums = _summed(job)
    if _outcome(job, sums):
        ended = _end(job, sums) or job.key.get()
        return {"finished": ended.outcome} if ended else {"skipped": "the job is gone"}
    if payload["check"] < MAX_CHECKS:
        _check_later(job.id, payload["check"] + 1)
    return {"progress": round(sums.progress, 4)}


def _end(job: MapperJob, sums: Figures) -> MapperJob | None:
    """Mark the job ended, once, its outcome as it stands in this transaction (a cancel may have come since), its tally
    settled and its on_done pending in the same commit; then queue the on_done. None when another call ended it."""
    definition = jobs.of(job)

    def look() -> Written | MapperJob:
        current = job.key.get(retries=0)
        if current is None or current.ended:  # gone, or ended: by another call, or by this one's UNKNOWN commit
            return Written(current and current.ended_by, current)
        return current

    def end(current: MapperJob, stamp: str) -> MapperJob:
        current.ended_by = stamp
        mark_ended(current, _outcome(current, sums) or "done",
                   {"processed": sums.processed, "tasks": sums.tasks, "depth": sums.depth,
                    "tally": sums.tally, "revived": sums.revived})
        settled = definition.settle(sums.tally, current.params) if definition and definition.settle else []
        ndb.put_multi([current, *settled])
        return current
    ended = once(look, end, then=send_follow_up, hot_key=job.key)
    return None if ended.by_another else ended.value


# --- the job's follow-up (JobDefinition.on_done): exactly once, by a task the sweep queues again until it ran --------

DONE_HANDLER = "mapper.done"


def mark_ended(job: MapperJob, outcome: str, summary: dict[str, Any]) -> None:
    """Write the job's end into `job` (put by the caller): its outcome, figures, and on_done pending, due in a lease."""
    job.ended, job.outcome, job.summary = clock.now(), outcome, summary
    definition = jobs.of(job)
    if definition and definition.on_done:
        job.follow_up = "pending"
        job.follow_up_due = job.ended + datetime.timedelta(seconds=runtime.current().settings.mapper_lease_seconds)


def send_follow_up(job: MapperJob) -> None:
    """After the commit that ended the job: queue the task that runs its on_done (a no-op for a job without one). The
    name makes a repeat of this call one task; the sweep's later sends have names of their own (`follow_up_sent`)."""
    if job.follow_up == "pending":
        runtime.tasks().enqueue(DONE_HANDLER, {"job": job.id}, f"{job.id}-done-{job.follow_up_sent}")


def run_follow_up(payload: dict[str, Any], delivery: int = 0) -> dict[str, Any]:
    """The follow-up task: run on_done (outside the transaction: it may query) and commit what it returns with the mark
    that it ran, so its writes land exactly once however often this task is delivered."""
    job = MapperJob.get_by_id(payload["job"], use_cache=False, use_global_cache=False)
    definition = jobs.of(job) if job else None
    if job is None or job.follow_up != "pending" or definition is None or definition.on_done is None:
        return {"skipped": "no follow-up pending"}
    writes = definition.on_done(job) or []

    def look() -> Written | MapperJob:
        current = job.key.get(retries=0)
        if current is None:  # deleted since: nothing to mark
            return Written(None, False)
        if current.follow_up == "ran":  # by another call, or by this one, whose commit answered UNKNOWN
            return Written(current.ran_by, True)
        return current

    def mark_ran(current: MapperJob, stamp: str) -> bool:
        current.follow_up, current.ran_by = "ran", stamp
        ndb.put_multi([current, *writes])
        return True
    ran = once(look, mark_ran, hot_key=job.key)
    return {"ran": not ran.by_another and ran.value}


def figures_of(job: MapperJob) -> Figures:
    """The job's state and figures: an ended job's from itself (exact), a running one's from its hints (`_hinted`)."""
    if job.ended:  # every task had handed its weight back
        return Figures(job.outcome, returned=TOTAL_WEIGHT, **(job.summary or {}))
    hinted = _hinted(job)
    if job.cancelled:
        hinted.state = "cancelled"
    return hinted


def end_by_admin(job: MapperJob) -> MapperJob:
    """End a job whose tasks have all reported back but that was not marked ended; Conflict while ranges are out."""
    if job.ended:
        return job
    sums = _summed(job)
    if _outcome(job, sums) is None:
        raise Conflict(f"The job is still running: {sums.progress:.0%} of its key range has reported back.",
                       "job_running")
    return errors.found(_end(job, sums) or job.key.get(), "The job is gone.", "no_such_job")
