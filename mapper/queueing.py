"""Handing a mapper task's children to the queue, and its handouts (the pages it scanned after its own, each handed
whole to a child as its page), kept beside the task's record (KeptHandouts), not in it: a redelivery or the sweep can
enqueue the same children again while the records, read whole when the job ends, stay small."""
from google.cloud import ndb

from core import runtime
from mapper.models import MapperJob
from mapper.task import TOTAL_WEIGHT, TaskPayload, TaskRecord

TASK_HANDLER = "mapper.run"
# At most this many bytes of urlsafe keys in all the handouts of one task: each child's task surely under the
# smallest task limit (100 KB for App Engine queues in the older API; Cloud Tasks takes 1 MB,
# https://cloud.google.com/tasks/docs/quotas), and the KeptHandouts far under an entity's 1 MiB.
HANDED_BYTES = 90_000


class KeptHandouts(ndb.Model):
    """A task's handouts, {child's path: urlsafe keys}. A child entity of the record, so it is written in the record's
    first chunk's transaction without taking one more of the legacy emulator's 25 entity groups; read only to enqueue
    the children again."""
    _use_cache = False
    _use_global_cache = False
    handouts = ndb.JsonProperty(default={})

    @classmethod
    def key_for(cls, record_key: ndb.Key) -> ndb.Key:
        return ndb.Key(cls, "handouts", parent=record_key)


def root_payload(job: MapperJob) -> TaskPayload:
    """The root task's: the kind's whole range, up to its largest key when the job started, and all the weight."""
    return TaskPayload(job.id, "0", None, job.kind_end.urlsafe().decode(), TOTAL_WEIGHT)


def enqueue(payload: TaskPayload) -> None:
    runtime.tasks().enqueue(TASK_HANDLER, payload.to_json(), payload.queue_name)


def cut_handouts(keys: list[ndb.Key], size: int) -> list[list[ndb.Key]]:
    """`keys` cut into handouts of `size`, as many of them as HANDED_BYTES of urlsafe keys hold."""
    handouts: list[list[ndb.Key]] = []
    used = 0
    for i in range(0, len(keys), size):
        used += sum(len(key.urlsafe()) for key in keys[i:i + size])
        if used > HANDED_BYTES:
            break
        handouts.append(keys[i:i + size])
    return handouts


def kept_apart(record_key: ndb.Key, children: list[TaskPayload]) -> list[KeptHandouts]:
    """The entity keeping the handout children's keys, written with the record's first chunk (none without handouts)."""
    handouts = {child.path: child.keys for child in children if child.keys is not None}
    return [KeptHandouts(key=KeptHandouts.key_for(record_key), handouts=handouts)] if handouts else []


def recorded(record: TaskRecord) -> list[TaskPayload]:
    """The children `record` split into, each as it was given: a handout's keys read back from its KeptHandouts."""
    apart = any(child.get("keys_apart") for child in record.children)
    if apart and (kept := KeptHandouts.key_for(record.key).get()) is None:
        raise RuntimeError(f"task {record.key.id()}: the pages it handed out are gone")
    return [TaskPayload.from_json({**child, "keys": kept.handouts[child["path"]]} if child.get("keys_apart") else child)
            for child in record.children]


def enqueue_all(payloads: list[TaskPayload]) -> None:  # by name: the queue drops a name it has seen
    for payload in payloads:
        enqueue(payload)


def payload_of(job: MapperJob, key: ndb.Key) -> TaskPayload:
    """What the task of record `key` was given, for the sweep: the root's from the job, any other's from its parent's
    record."""
    job_id, path = key.id().split("-", 1)
    if path == "0":
        return root_payload(job)
    parent = ndb.Key(TaskRecord, f"{job_id}-{path.rsplit('-', 1)[0]}").get()
    child = next((c for c in recorded(parent) if c.path == path), None) if parent else None
    if child is None:
        raise RuntimeError(f"task {job_id}-{path}: its parent's record is gone, or never split into it")
    return child
