"""A mapper task ended unvisited, before its page is done: its job was cancelled, or it failed for good."""
from google.cloud import ndb

from core import clock
from core.transactions import transact
from mapper import queueing
from mapper.task import TaskPayload, TaskRecord


def end_unvisited(record_key: ndb.Key, payload: TaskPayload, state: str,
              error: str | None = None) -> tuple[TaskRecord, int]:
    """End the task's record unvisited, `state`, returning its own share, so the job still ends; its children are
    enqueued again. (The record, the weight this call passes on to the job's running sum: 0 when another delivery
    ended it first.) Idempotent by state, so no stamp: an attempt after an UNKNOWN commit finds the record ended and
    passes on 0, and the job's checks sum the records, which hold this weight."""
    def txn() -> tuple[TaskRecord, int]:
        record = record_key.get(retries=0) or TaskRecord.new(record_key, payload)
        if record.state != "running":
            return record, 0
        record.state, record.error, record.updated = state, error, clock.now()  # `returned`: its own share
        record.renew()  # ended: a lease only to check its children
        record.put()
        return record, record.returned
    record, passed_on = transact(txn)
    queueing.enqueue_all(queueing.recorded(record))
    return record, passed_on
