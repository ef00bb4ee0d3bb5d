"""Idempotency markers that are nothing but markers (a counter's increment, a post, a comment, a seed) expire, and a
task purges the expired ones: anyone signed in may send fresh keys, so markers kept for ever would grow storage without
bound, and neither emulator applies TTL policies (production may also delete them by TTL: counters/production.py).
A mapper job, its own start's marker (core/idempotency.Marker), is kept with the job instead.
"""
import datetime
import logging
from typing import Any

from google.cloud import ndb

from core import clock, runtime
from core.idempotency import Keyed, Marker

log = logging.getLogger(__name__)
# How long an Idempotency-Key is honoured at least (Stripe keeps its keys 24 hours:
# https://docs.stripe.com/api/idempotent_requests).
LIFETIME = datetime.timedelta(days=1)
PURGE_HANDLER = "markers.purge"
PURGE_BATCH = 500  # keys a query fetches and one commit deletes (a commit takes at most 500 mutations)
PURGE_BATCHES = 20  # per task; a task with more to do enqueues the next one, so none runs long
_PURGED = "markers.purged_hour"  # the runtime's note of the last hour this process asked for a purge


class ExpiringMarker(Marker):
    """A marker that is nothing but a marker, kept LIFETIME and then purged (`purge`)."""
    # Midnight UTC, a day or two ahead: indexed for the purge's query, and coarse on purpose. Index rows sort by value
    # then key, so one day's markers spread over their keys (digests: core/idempotency.marker_name), where an exact
    # timestamp would put every new row at the end of the index: the hotspot Firestore documents as a limit of 500
    # writes a second (https://cloud.google.com/firestore/docs/solutions/shard-timestamp).
    expires = ndb.DateTimeProperty(required=True)

    @classmethod
    def new(cls, key: ndb.Key, request: Keyed | None, stamp: str, answer: dict[str, Any]) -> "ExpiringMarker":
        """The marker `key` of `request` (None: a call's own marker, named by its stamp), written by call `stamp`."""
        purge_this_hour()
        day = (clock.now() + LIFETIME).replace(hour=0, minute=0, second=0, microsecond=0)
        return cls(key=key, fingerprint=request and request.fingerprint, call=stamp, answer=answer,
                   expires=day + datetime.timedelta(days=1))


def purge_this_hour() -> None:
    """When a marker is made: make sure a purge runs this hour. Each process asks once an hour, under a task name of
    the hour, so every process's request is the same one task (a queue drops a name used before: core/tasks.py).
    Never fails the write it rides on."""
    hour = clock.now().strftime("%Y%m%d%H")
    noted = runtime.current().registry(_PURGED)
    if noted.get("hour") == hour:
        return
    noted["hour"] = hour
    try:
        runtime.tasks().enqueue(PURGE_HANDLER, {"hour": hour, "part": 0}, f"markers-purge-{hour}-0")
    except Exception:  # noqa: BLE001 - no queue here (a script) or the queue is away: the next hour asks again
        log.warning("could not enqueue the idempotency markers' purge", exc_info=True)


def purge(payload: dict[str, Any], delivery: int = 0) -> dict[str, Any]:
    """A task: delete the expired markers of every kind, PURGE_BATCHES batches at most, then hand on to the next part.
    Keys only: billed as one read, not one per entity. Eventually consistent on legacy Datastore: a key deleted a
    moment ago may come back once, and deleting it again is harmless (a marker is never rewritten)."""
    now, deleted = clock.now(), 0
    for _ in range(PURGE_BATCHES):
        keys = [key for kind in ExpiringMarker.__subclasses__()  # every kind of expiring marker the app defines
                for key in kind.query(kind.expires <= now).fetch(PURGE_BATCH, keys_only=True)][:PURGE_BATCH]
        if not keys:
            return {"deleted": deleted}
        ndb.delete_multi(keys)
        deleted += len(keys)
    part = int(payload.get("part", 0)) + 1
    runtime.tasks().enqueue(PURGE_HANDLER, {"hour": payload["hour"], "part": part},
                            f"markers-purge-{payload['hour']}-{part}")
    return {"deleted": deleted, "more": True}
