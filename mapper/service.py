"""The adaptive-sharding mapper's jobs: started (the kind's range and samples noted, the root task enqueued), listed,
cancelled, finished by an admin. A job's tasks are tree.py; its progress and end, completion.py.
"""
import re
import secrets
from typing import Any

from google.cloud import ndb

from core import clock
from core.errors import BadInput, Conflict, Unprocessable, found
from core.transactions import transact
from core.validate import whole_number
from mapper import completion, jobs, keyrange, tree
from mapper.models import TOTAL_CREDIT, MapperJob, TaskPayload

JOB_ID_PATTERN = re.compile(r"[0-9a-f]{16}")
SAMPLES = 512  # __scatter__ keys read when a job starts: a few per final range of a tree of ~100 tasks
MAX_PAGE_SIZE = 500
LIST_LIMIT = 20


def start_job(name: object, params: object = None, page_size: object = None, fanout: object = None) -> MapperJob:
    """Check the job and its params, note the kind's range and samples, enqueue the root task; the MapperJob."""
    definition = jobs.definition_of(name)
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise Unprocessable("params must be a JSON object.", "bad_params")
    page_size = whole_number(page_size, "page_size", 1, MAX_PAGE_SIZE, default=definition.page_size, from_json=True)
    fanout = whole_number(fanout, "fanout", 2, 16, default=definition.fanout, from_json=True)
    params = definition.parse_params(params)  # last: a job's parse_params may write what it needs, once all is valid

    query = ndb.Query(kind=definition.kind)
    # The root range ends at the kind's largest key (none: the kind is empty). A descending key order needs a
    # composite index per kind (index.yaml), in production as in the emulator.
    last = query.order(-tree.KEY).fetch(1, keys_only=True)
    samples = query.order(ndb.GenericProperty("__scatter__")).fetch(SAMPLES, keys_only=True) if last and SAMPLES else []
    job = MapperJob(id=secrets.token_hex(8), name=name, params=params, kind=definition.kind, page_size=page_size,
                    fanout=fanout, last_key=last[0] if last else None, samples=sorted(samples, key=keyrange.order))
    if not last:  # nothing to visit: done at once
        job.finished, job.outcome, job.summary = clock.now(), "done", {"processed": 0, "tasks": 0, "depth": 0}
        job.put()
        completion.finished(job)
        return job
    job.put()
    completion.start_hints(job.id)
    tree.enqueue(TaskPayload(job.id, "0", None, job.last_key.urlsafe().decode(), TOTAL_CREDIT))
    return job


def job_dict(job: MapperJob) -> dict[str, Any]:
    s = completion.status(job)
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
            if job.cancelled:  # by an earlier cancel, or by this one's own commit that answered UNKNOWN: done already
                return job
            raise Conflict("The job has finished already.", "job_finished")
        job.cancelled = True
        job.put()
        return job
    # In turn with the job's other writers: the task that finishes it (_finalize) and another admin's cancel.
    return transact(txn, hot_key=key)


def finish_job(job_id: object) -> MapperJob:
    """Admin: finish a running job whose tasks have all reported back but that was not marked finished."""
    return completion.finish(get_job(job_id))


def job_timeline(job_id: object) -> dict[str, Any]:
    """The job, and its tasks as a timeline (completion.timeline)."""
    job = get_job(job_id)
    return {"job": job_dict(job), **completion.timeline(job)}
