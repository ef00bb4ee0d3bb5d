"""The sweep: no job strands (docs/lessons/mapper.md). Run every `mapper_sweep_seconds` by cron.yaml, it queues again
each task whose lease ran out, sums a running job with no task at work, and sends again a follow-up not yet run; at
most SWEEP_BATCH of each a run. The lease is a hint, never a lock (a record's last_key is). The queries have no
ancestor, so on legacy Datastore they are eventually consistent: a lease just run out may show one run later.
"""
import dataclasses
import datetime
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from google.cloud import ndb

from core import clock, runtime
from core.exactly_once import Written, once
from core.transactions import transact
from mapper import completion, queueing
from mapper.models import MapperJob
from mapper.task import TaskPayload, TaskRecord
from mapper.unvisited import end_unvisited

log = logging.getLogger(__name__)
T = TypeVar("T")

SWEEP_BATCH = 100
# A task taken up this many times in a row with no chunk committed between (TaskRecord.fruitless) fails, so that the
# job ends ("failed") instead of being retried for ever.
MAX_REVIVALS = 5
EPOCH = datetime.datetime(2000, 1, 1)  # the query's lower bound on a lease: an ended record's is null, sorted first


def sweep() -> dict[str, Any]:
    """One run: what it queued again, failed, summed and sent again; an item that raises is left to the next run."""
    now = clock.now()
    expired = TaskRecord.query(TaskRecord.lease < now, TaskRecord.lease > EPOCH).fetch(SWEEP_BATCH, keys_only=True)
    outcomes = {key.id(): _each(_take_up, key, now) for key in expired}
    revived = [name for name, outcome in outcomes.items() if outcome == "revived"]
    failed = [name for name, outcome in outcomes.items() if outcome == "failed"]
    at_work = {name.split("-", 1)[0] for name in revived}  # a task just queued again: its lease is live
    running = {key.id() for key in MapperJob.query(MapperJob.ended == None).fetch(  # noqa: E711 (ndb's null)
        SWEEP_BATCH, keys_only=True)}
    summed = [job_id for job_id in sorted(running - at_work) if _each(_finish_if_every_task_ended, job_id, now)]
    due = [job.key for job in MapperJob.query(MapperJob.follow_up == "pending").fetch(SWEEP_BATCH)
           if job.follow_up_due is None or job.follow_up_due <= now]
    follow_ups = [sent.id for sent in (_each(_resend_follow_up, key, now) for key in due) if sent]
    return {"revived": revived, "failed": failed, "summed": summed, "follow_ups": follow_ups}


def _each(step: Callable[..., T], *args: Any) -> T | None:
    """One item of a run; None, logged, when it raised (a task that could not be queued, Datastore away)."""
    try:
        return step(*args)
    except Exception:
        log.exception("mapper sweep: %s%r failed; the next run tries again", step.__name__, args)
        return None


def _finish_if_every_task_ended(job_id: str, now: datetime.datetime) -> bool:
    """A running job none of whose records holds a live lease has no task at work: its last delivery may have died
    before adding its weight to the running sum, so nothing comes back to end it. Sum its records once here; one
    keys-only query per running job a run. True when summed."""
    job = MapperJob.get_by_id(job_id)
    if job is None or job.ended is not None:
        return False
    if TaskRecord.query(TaskRecord.job == job_id, TaskRecord.lease > now).fetch(1, keys_only=True):
        return False
    completion.end_if_summed(job)
    return True


def _take_up(key: ndb.Key, now: datetime.datetime) -> str | None:
    """The record of `key`, whose lease ran out: "revived" (its task, or an ended one's children, queued again),
    "failed" (taken up MAX_REVIVALS times already), or None (it moved on, or its job has ended)."""
    job = MapperJob.get_by_id(key.id().split("-", 1)[0])
    ended = job is None or job.ended is not None

    def look() -> Written | TaskRecord:
        record = key.get(retries=0)
        if record is None or record.lease is None:
            return Written(None)  # nothing to take up
        if record.lease > now:  # renewed since the query: by this call's own commit
            return Written(record.revived_by, record)  # (UNKNOWN, yet applied), or by its delivery, alive
        return record

    def take_up(record: TaskRecord, stamp: str) -> TaskRecord | None:
        if ended or record.state != "running":  # off the sweep's list (an ended one once its children are checked)
            if not ended and record.children:
                return record  # its children first, below; it stays on the list until they all have records
            record.lease = None
        else:
            record.revived, record.fruitless = record.revived + 1, (record.fruitless or 0) + 1
            record.revived_by = stamp
            record.renew()  # the new delivery's: if it dies too, the next run after this lease takes it up
        record.put()
        return None if ended or record.lease is None else record
    taken = once(look, take_up)
    record = None if taken.by_another else taken.value
    if record is None or job is None:
        return None
    if record.state != "running":
        return _children_recorded(job, record)
    payload = dataclasses.replace(queueing.payload_of(job, record.key), revived=record.revived)
    if record.fruitless > MAX_REVIVALS:
        log.error("mapper task %s died %d times; failed for good", key.id(), record.fruitless)
        _, passed_on = end_unvisited(key, payload, "failed", f"taken up again {MAX_REVIVALS} times, and died each time")
        completion.end_if_all_back(job, passed_on)
        return "failed"
    queueing.enqueue(payload)
    completion.hint_revived(job.id)
    return "revived"


def _children_recorded(job: MapperJob, parent: TaskRecord) -> str | None:
    """Each child of an ended record without a record of its own (every delivery died before its first commit) gets
    one, leased, and its task queued again; then the parent's lease is cleared."""
    payloads = [TaskPayload.from_json(child) for child in parent.children]
    missing = [p for p, record in zip(payloads, ndb.get_multi([ndb.Key(TaskRecord, p.name) for p in payloads]),
                                      strict=True) if record is None]
    for child in missing:
        payload = dataclasses.replace(queueing.payload_of(job, ndb.Key(TaskRecord, child.name)), revived=1)

        def look(payload: TaskPayload = payload) -> Written | None:
            found = ndb.Key(TaskRecord, payload.name).get(retries=0)  # written by its delivery meanwhile, or by this
            return found and Written(found.recorded_by)  # call's own commit, which answered UNKNOWN yet applied

        def create(_: None, stamp: str, payload: TaskPayload = payload) -> None:
            record = TaskRecord.new(ndb.Key(TaskRecord, payload.name), payload)
            record.revived, record.fruitless, record.recorded_by = 1, 1, stamp
            record.renew()
            record.put()

        def queue_it(_: None, payload: TaskPayload = payload) -> None:
            queueing.enqueue(payload)
            completion.hint_revived(job.id)
        once(look, create, then=queue_it)

    def clear() -> None:
        record = parent.key.get(retries=0)
        if record is not None and record.state != "running":
            record.lease = None
            record.put()
    transact(clear)
    return "revived" if missing else None


def _resend_follow_up(key: ndb.Key, now: datetime.datetime) -> MapperJob | None:
    """Queue an ended job's follow-up again (a new task) if it has not reported by its due time; the job, or None."""
    lease = datetime.timedelta(seconds=runtime.current().settings.mapper_lease_seconds)

    def look() -> Written | MapperJob:
        job = key.get(retries=0)
        if job is None or job.follow_up != "pending":
            return Written(None)  # nothing to send: gone, or the follow-up ran
        if job.follow_up_due is not None and job.follow_up_due > now:  # sent again since: by this call's own commit
            return Written(job.resent_by, job)  # (UNKNOWN, yet applied), or by another sweep
        return job

    def resend(job: MapperJob, stamp: str) -> MapperJob:
        job.follow_up_sent, job.follow_up_due, job.resent_by = job.follow_up_sent + 1, now + lease, stamp
        job.put()
        return job
    resent = once(look, resend, then=completion.send_follow_up, hot_key=key)
    return None if resent.by_another else resent.value
