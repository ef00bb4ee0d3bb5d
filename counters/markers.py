"""Idempotency markers (models.AppliedIncrement) expire, and a task sweeps the expired ones: neither emulator applies
TTL policies, and anyone signed in may send fresh keys (docs/lessons/counters.md)."""
import logging
from typing import Any

from google.cloud import ndb

from core import clock, runtime
from counters.models import AppliedIncrement

log = logging.getLogger(__name__)
SWEEP_HANDLER = "counters.sweep_markers"
SWEEP_BATCH = 500  # keys a query fetches and one commit deletes (a commit takes at most 500 mutations)
SWEEP_BATCHES = 20  # per task; a task with more to do enqueues the next one, so none runs long
_SWEPT = "counters.swept_hour"  # the runtime's note of the last hour this process asked for a sweep


def sweep_this_hour() -> None:
    """After a marker was written: make sure a sweep runs this hour. Each process asks once an hour, under a task name
    of the hour, so every process's request is the same one task (a queue drops a name used before: core/tasks.py).
    Never fails the increment it follows."""
    hour = clock.now().strftime("%Y%m%d%H")
    noted = runtime.current().registry(_SWEPT)
    if noted.get("hour") == hour:
        return
    noted["hour"] = hour
    try:
        runtime.tasks().enqueue(SWEEP_HANDLER, {"hour": hour, "part": 0}, f"counters-sweep-{hour}-0")
    except Exception:  # noqa: BLE001 - no queue here (a script) or the queue is away: the next hour asks again
        log.warning("could not enqueue the idempotency markers' sweep", exc_info=True)


def sweep_markers(payload: dict[str, Any], attempt: int = 0) -> dict[str, Any]:
    """A task: delete the expired markers, SWEEP_BATCHES batches at most, then hand on to the next part. Keys only:
    billed as one read, not one per entity. Eventually consistent on legacy Datastore: a key deleted a moment ago may
    come back once, and deleting it again is harmless (a marker is never rewritten)."""
    now, deleted = clock.now(), 0
    for _ in range(SWEEP_BATCHES):
        keys = AppliedIncrement.query(AppliedIncrement.expires <= now).fetch(SWEEP_BATCH, keys_only=True)
        if not keys:
            return {"deleted": deleted}
        ndb.delete_multi(keys)
        deleted += len(keys)
    part = int(payload.get("part", 0)) + 1
    runtime.tasks().enqueue(SWEEP_HANDLER, {"hour": payload["hour"], "part": part},
                            f"counters-sweep-{payload['hour']}-{part}")
    return {"deleted": deleted, "more": True}
