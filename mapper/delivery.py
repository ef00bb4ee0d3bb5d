"""A delivery of one mapper task (the queue's handler): what tree.py's idea needs around it. The job read, a cancelled
job's task handed back, a redelivery going on from its record, a delivery that finds another ahead of it stepping back
(409, tried later), one that failed for good handing its weight back, and the task's end reported to the job.
"""
import logging
from typing import Any

from google.cloud import ndb

from core import clock, tasks
from core.errors import Conflict
from mapper import completion, jobs, queueing, tree
from mapper.models import MapperJob
from mapper.task import TaskPayload, TaskRecord
from mapper.unvisited import end_unvisited

log = logging.getLogger(__name__)


def run_task(body: dict[str, Any], failed_before: int = 0) -> dict[str, Any]:
    """One delivery of a task of a job's tree (`failed_before`: how many deliveries of it failed); what it did."""
    payload = TaskPayload.from_json(body)
    job = MapperJob.get_by_id(payload.job)
    if job is None or job.ended:
        return {"skipped": "the job is gone or has ended"}
    record_key = ndb.Key(TaskRecord, payload.name)
    if job.cancelled:  # the rest of its range left unvisited and its weight handed back: the job still ends
        record, passed_on = end_unvisited(record_key, payload, "done")
    else:
        record, passed_on = _run(job, record_key, payload, failed_before)
    if record.returned:  # only the delivery that ended the record passes its weight on; any other passes 0
        completion.end_if_all_back(job, passed_on)
    return {"processed": record.processed, "children": len(record.children)}


def _run(job: MapperJob, record_key: ndb.Key, payload: TaskPayload, failed_before: int) -> tuple[TaskRecord, int]:
    """This delivery's work on its task: (the record as it left it, the weight it passes on to the job's sum)."""
    # A first delivery does not read its record (its first chunk's transaction does: one lookup fewer a task); a
    # redelivery, and the sweep's, reads it and goes on from it.
    record = (record_key.get() if failed_before or payload.revived else None) or TaskRecord.new(record_key, payload)
    record.started = record.started or clock.now()  # a record written before any delivery began has none yet
    if record.state != "running":
        queueing.enqueue_all(queueing.recorded(record))  # the delivery that ended it may have died before queueing them
        return record, 0  # only the delivery that ended the record passed its weight on
    definition = jobs.of(job)
    try:
        if definition is None:
            raise RuntimeError(f"job {job.name!r} is not registered in this version of the app")
        processed_before = record.processed
        record = tree.process(job, definition, record, payload)
        completion.hint(job, record, record.processed - processed_before, record.state == "done")
        return record, record.returned
    except tree.Superseded:  # another delivery moved the record on (it is alive, and ends it)
        raise Conflict("Another delivery ran this task on; try later.", "superseded") from None
    except Exception as e:
        if failed_before + 1 < tasks.MAX_DELIVERIES:
            raise
        log.exception("mapper task %s failed for good", record_key.id())
        return end_unvisited(record_key, payload, "failed", f"{type(e).__name__}: {e}"[:2000])
