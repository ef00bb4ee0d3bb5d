"""The mapper's jobs: started, listed, cancelled, ended by an admin. Its tasks: tree.py; its progress and end,
completion.py."""
import re
import secrets
from typing import Any

from google.cloud import ndb

from core import clock, idempotency, validate
from core.errors import BadInput, Conflict, Unprocessable, found
from core.exactly_once import once
from core.transactions import transact
from core.validate import whole_number
from mapper import completion, jobs, key_arithmetic, queueing
from mapper.models import MapperJob
from mapper.task import TaskRecord

JOB_ID_PATTERN = re.compile(r"[0-9a-f]{16}")
SAMPLES = 512  # __scatter__ keys read when a job starts: a few per final range of a tree of ~100 tasks
MAX_PAGE_SIZE = 500
MIN_FANOUT, MAX_FANOUT = 2, 16  # ranges a task splits the rest of its range into, at most
LIST_LIMIT = 20
ENDPOINT = "mapper.start"  # what a start's Idempotency-Key is scoped to, with its caller

KEY = ndb.model.ModelKey()  # the __key__ pseudo-property, to sort by key


def start_job(name: object, params: object = None, page_size: object = None, fanout: object = None,
              idempotency_key: str | None = None, user: str = "") -> MapperJob:
    """Check the job and its params, note the kind's range and samples, enqueue the root task; the MapperJob."""
    return start(name, params, page_size, fanout, idempotency_key, user)[0]


def start(name: object, params: object = None, page_size: object = None, fanout: object = None,
          idempotency_key: str | None = None, user: str = "") -> tuple[MapperJob, bool]:
    """`start_job`: (the job, replayed). With an idempotency key (`user`'s own: core/idempotency.py) the job's id is
    derived from it and the job inserted only if that id is free: a resend answers the first one's job (replayed
    True) and starts nothing; the key sent for another job or other settings is a 409. The job is its own marker."""
    validate.idempotency_key(idempotency_key)
    definition = jobs.definition_of(name)
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise Unprocessable("params must be a JSON object.", "bad_params")
    page_size = whole_number(page_size, "page_size", 1, MAX_PAGE_SIZE, default=definition.page_size, from_json=True)
    fanout = whole_number(fanout, "fanout", MIN_FANOUT, MAX_FANOUT, default=definition.fanout, from_json=True)
    params = definition.parse_params(params)  # last: a job's parse_params may write what it needs, once all is valid
    request = idempotency.keyed(idempotency_key, user or None, ENDPOINT, None,
                                {"name": definition.name, "params": params, "page_size": page_size, "fanout": fanout})
    job_id = idempotency.derived_id(request, 16) if request else secrets.token_hex(8)
    if request:
        first = MapperJob.get_by_id(job_id)
        if first is not None:  # another call's job: a replay, or a 409 (other content: `written` says so)
            idempotency.written(first, request)
            return _resent(first), True

    query = ndb.Query(kind=definition.kind)
    # The root range ends at the kind's largest key (none: the kind is empty). A descending key order needs a
    # composite index per kind (index.yaml), in production as in the emulator.
    last = query.order(-KEY).fetch(1, keys_only=True)
    samples = query.order(ndb.GenericProperty("__scatter__")).fetch(SAMPLES, keys_only=True) if last and SAMPLES else []
    job = MapperJob(id=job_id, name=definition.name, params=params, kind=definition.kind, page_size=page_size,
                    fanout=fanout, kind_end=last[0] if last else None,
                    samples=sorted(samples, key=key_arithmetic.order),
                    fingerprint=request.fingerprint if request else None,
                    created=clock.now())  # before `ended`, which an empty kind's job gets at once
    root = None
    if not last:  # nothing to visit: done at once
        completion.mark_ended(job, "done", {"processed": 0, "tasks": 0, "depth": 0})
    else:  # the root's record, leased: if every delivery of the root dies before its first commit, the sweep runs it
        payload = queueing.root_payload(job)
        root = TaskRecord.new(ndb.Key(TaskRecord, payload.name), payload)
        root.renew()
    inserted = _insert(job, root, request)
    if inserted is not job:  # the same key's other request, at the same moment, got there first
        return _resent(inserted), True
    if job.ended:
        completion.send_follow_up(job)
        return job, False
    completion.start_hints(job.id)
    queueing.enqueue(queueing.root_payload(job))
    return job, False


def _insert(job: MapperJob, root: TaskRecord | None, request: idempotency.Keyed | None) -> MapperJob:
    """Put `job` and its root task's record unless its id is taken: `job`, or the job found under its id (or a 409)."""
    def insert(_: None, stamp: str) -> None:
        job.call = stamp
        ndb.put_multi([job, root] if root else [job])

    inserted = once(lambda: idempotency.written(job.key.get(retries=0), request), insert, hot_key=job.key)
    return job.key.get(use_cache=False) if inserted.by_another else job  # another request's job, or this call's


def _resent(first: MapperJob) -> MapperJob:
    """The job a resend's key started; its root task enqueued again while it runs (its name makes that one task), in
    case the first request died between the job's commit and its enqueue."""
    if not first.ended:
        queueing.enqueue(queueing.root_payload(first))
    return first


def job_dict(job: MapperJob) -> dict[str, Any]:
    s = completion.figures_of(job)
    end = job.ended or clock.now()
    return {"id": job.id, "name": job.name, "params": job.params, "state": s.state, "processed": s.processed,
            "progress": round(s.progress, 4), "tasks": s.tasks, "depth": s.depth, "fanout": job.fanout,
            "page_size": job.page_size, "created": clock.iso(job.created), "tally": s.tally,
            "estimated": s.estimated, "revived": s.revived, "elapsed": round((end - job.created).total_seconds(), 1)}


def get_job(job_id: object) -> MapperJob:
    if not isinstance(job_id, str) or not JOB_ID_PATTERN.fullmatch(job_id):
        raise BadInput("A job id is 16 hex digits.", "bad_job_id")
    return found(MapperJob.get_by_id(job_id), f"There is no job {job_id}.", "no_such_job")


def list_jobs(limit: int = LIST_LIMIT) -> list[MapperJob]:
    return MapperJob.query().order(-MapperJob.created).fetch(limit)


def cancel_job(job_id: object) -> MapperJob:
    """Stop a running job: tasks not yet run skip it. Entities already processed stay processed."""
    key = get_job(job_id).key

    # No stamp (core.transactions.Call): a cancel is idempotent by state. Its retry after an UNKNOWN commit that applied
    # finds `cancelled` set and answers the job, as it answers a second admin's cancel; nothing follows the commit.
    def txn() -> MapperJob:
        job = found(key.get(retries=0), f"There is no job {job_id}.", "no_such_job")
        if job.ended:
            if job.cancelled:  # by an earlier cancel, or by this one's own commit that answered UNKNOWN: done already
                return job
            raise Conflict("The job has finished already.", "job_finished")
        job.cancelled = True
        job.put()
        return job
    # In turn with the job's other writers: the task that ends it (completion._end) and another admin's cancel.
    return transact(txn, hot_key=key)


def finish_job(job_id: object) -> MapperJob:
    """Admin: end a running job whose tasks have all reported back but that was not marked ended."""
    return completion.end_by_admin(get_job(job_id))


def job_timeline(job: MapperJob) -> dict[str, Any]:
    return {"job": job_dict(job), **completion.timeline(job)}
