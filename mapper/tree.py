"""One task of a mapper job, delivered by a queue at least once: the talk's "split big jobs into many small tasks".

A task lists the first pages of its key range in one keys-only query in key order (never limit+offset, which reads
and skips every key before its page: O(N^2) over a kind). It keeps the first page, hands each page after it whole to
a child task, and splits the range beyond into up to `fanout` child ranges: a tree O(log N) deep that keeps every
worker of the queue busy. Then it processes its page in chunks, each chunk's entities written in one transaction with
the task's own record (how far the page got; its children). So each entity is processed exactly once: a retry goes
on from the record, another delivery finds it moved on and steps back, and no two tasks write one entity. The
reasoning, step by step: docs/lessons/mapper.md."""
import functools
import itertools
import logging
from typing import Any

from google.cloud import ndb

from core import clock, runtime, tasks
from core.errors import Conflict
from core.transactions import Call
from mapper import bulk, completion, handoff, jobs, keyrange
from mapper.handback import hand_back
from mapper.models import MapperJob
from mapper.task import TaskPage, TaskPayload, TaskRecord

log = logging.getLogger(__name__)
KEY = ndb.model.ModelKey()  # the __key__ pseudo-property, for filters and sort orders on keys


def run_task(body: dict[str, Any], attempt: int = 0) -> dict[str, Any]:
    """One task of a job's tree (`attempt`: how many deliveries of it failed before this one); what it did."""
    payload = TaskPayload.from_json(body)
    job = MapperJob.get_by_id(payload.job)
    if job is None or job.ended:
        return {"skipped": "the job is gone or has ended"}
    record_key = ndb.Key(TaskRecord, payload.name)
    if job.cancelled:  # the rest of its range left unvisited and its credit handed back: the job still ends
        record, returned_here = hand_back(record_key, payload, "done")
    else:
        record, returned_here = _run(job, record_key, payload, attempt)
    if record.returned:  # only the delivery that ended the record passes its credit on; any other passes 0
        completion.end_if_all_back(job, returned_here)
    return {"processed": record.processed, "children": len(record.children)}


def _process(job: MapperJob, definition: jobs.JobDefinition, record: TaskRecord, payload: TaskPayload) -> TaskRecord:
    """List, hand out and split (a range task's first delivery), then process the page in chunks; the last record."""
    page, children = record.page, []
    handed = payload.handed_keys  # the page's keys, when the parent listed this page and handed it out
    if handed is not None:  # no query: the page's keys after the last one done
        keys = handed[handed.index(record.last_key) + 1:] if record.last_key else handed
        page = page or TaskPage(handed[0], handed[-1], False)
    elif page is None:  # a range task's first delivery: its page and the pages after it, in one query
        listed = _page_keys(job.kind, payload.lo_key, payload.hi_key, handoff.listing_limit(job.page_size, job.fanout))
        keys = listed[:job.page_size]
        page = TaskPage(keys[0], keys[-1], len(listed) > len(keys)) if keys else TaskPage(None, None, False)
        children = _split(job, payload, listed, record.credit) if page.more else []
    else:  # a retry: the rest of the page its first delivery fixed, to its last key however many were added since
        keys = _page_keys(job.kind, record.last_key or payload.lo_key, page.end)
    prepared = definition.prepare(keys, job.params) if definition.prepare else None
    size = jobs.chunk(definition)
    store = bulk.chunks_for(definition)  # how its chunks read and write: ndb's models, or protobufs
    apply, tally_of = bulk.effect_of(definition, job.params)
    chunks = [keys[i:i + size] for i in range(0, len(keys), size)] or [[]]  # an empty page: one chunk, the record
    handed_pages = handoff.handed_pages(children)
    lease = runtime.current().settings.mapper_lease_seconds

    def txn(call: Call, chunk: list[ndb.Key], expected_last_key: ndb.Key | None, final: bool) -> TaskRecord:
        # The record and the chunk in one lookup: no other task's transaction touches them, so tasks never collide.
        current, *entities = store.get_multi([record.key] + chunk)
        if current is not None and call.applied(current.last_chunk_by):
            return current  # this chunk's own commit applied, though it answered UNKNOWN: go on from it
        if current is None and expected_last_key is None and record.page_end is None:  # no delivery wrote it yet
            current = TaskRecord.new(record.key, payload)
            current.started = record.started  # when this delivery began, before its page query
        elif current is None or current.state != "running" or current.last_key != expected_last_key:
            raise Superseded()
        current.started = current.started or record.started  # the root's and the sweep's records begin now
        entities = [e for e in entities if e is not None]  # deleted since the query: skipped
        writes = apply(entities, job.params, prepared) if entities else []
        tally = tally_of(entities, job.params) if tally_of and entities else None
        handed_out = handoff.kept(current.key, handed_pages) if current.page_end is None else []  # first chunk
        current.advance(page, chunk, len(entities), tally, children, final)
        current.renew(lease)  # this delivery is alive: the sweep leaves the task alone until the lease runs out
        current.last_chunk_by = call.id
        store.put_multi([*writes, current, *handed_out])
        return current

    for number, chunk in enumerate(chunks):  # each chunk a Call of its own, shared by its transaction's retries
        record = store.transact(functools.partial(txn, Call(), chunk, record.last_key, number == len(chunks) - 1))
        if number == 0:  # the split is recorded (by this delivery or an earlier one): the children start now
            handoff.enqueue_children(record, handed_pages if children else None)
    return record


def _split(job: MapperJob, payload: TaskPayload, listed: list[ndb.Key], credit: int) -> list[TaskPayload]:
    """The rest of the range after this task's page, as children: each page `listed` after its own handed out whole
    (as many as fit handoff.HANDED_BYTES), then what lies beyond split into up to `fanout` ranges. Each child gets an
    equal share of `credit`; the task keeps one share and the remainder for its own page."""
    size, listed_max = job.page_size, handoff.listing_limit(job.page_size, job.fanout) - 1  # without the one more key
    pages = handoff.pages_to_hand_out(listed[size:listed_max], size)
    covered = min(size * (len(pages) + 1), len(listed))  # keys of its own page and of the pages handed out
    ranges = []
    if len(listed) > covered:  # keys remain after them: cut at __scatter__ quantiles, else by key arithmetic
        end, hi = listed[covered - 1], payload.hi_key
        parts = keyrange.parts_needed(page_start=listed[0], page_end=end, hi=hi, page_len=covered,
                                      per_task=listed_max, k=job.fanout, samples=job.samples)
        bounds = [end] + (keyrange.split_points(end, hi, parts, job.samples, listed[0]) if parts > 1 else []) + [hi]
        ranges = list(itertools.pairwise(bounds))
    share = credit // (len(pages) + len(ranges) + 1)
    if share == 0:  # credit too finely divided (a long chain of ranges that could not split)
        if credit < 2:  # no credit to hand on: the job fails rather than end with this range unvisited
            raise RuntimeError(f"task {payload.task}: its credit is spent and its range is not")
        return [payload.range_child(0, listed[size - 1], payload.hi_key, credit // 2)]  # one child lists the rest
    return ([payload.page_child(i, keys, share) for i, keys in enumerate(pages)] +
            [payload.range_child(len(pages) + i, lo, hi, share) for i, (lo, hi) in enumerate(ranges)])


# --- what serves the idea: a delivery's start and its failures, the page's query -----------------------------------

class Superseded(Exception):
    """Another delivery of the same task moved its record on: this one must stop and let the queue try later."""


def _run(job: MapperJob, record_key: ndb.Key, payload: TaskPayload, attempt: int) -> tuple[TaskRecord, int]:
    """This delivery's work on its task: (the record as it left it, the credit it returned)."""
    # A first delivery does not read its record (its first chunk's transaction does: one lookup fewer a task); a
    # redelivery, and the sweep's, reads it and goes on from it.
    record = (record_key.get() if attempt or payload.revived else None) or TaskRecord.new(record_key, payload)
    record.started = record.started or clock.now()  # a record written before any delivery began has none yet
    if record.state != "running":
        handoff.enqueue_children(record)  # the delivery that ended it may have died before enqueueing them
        return record, 0  # only the delivery that ended the record returned its credit
    definition = jobs.of(job)
    try:
        if definition is None:
            raise RuntimeError(f"job {job.name!r} is not registered in this version of the app")
        processed_before = record.processed
        record = _process(job, definition, record, payload)
        completion.hint(job, record, record.processed - processed_before, record.state == "done")
        return record, record.returned
    except Superseded:  # another delivery moved the record on: it is alive, and ends the record
        raise Conflict("Another delivery of this task is running it; try later.", "superseded") from None
    except Exception as e:
        if attempt + 1 < tasks.MAX_ATTEMPTS:
            raise
        log.exception("mapper task %s failed for good", record_key.id())
        return hand_back(record_key, payload, "failed", f"{type(e).__name__}: {e}"[:2000])


def _page_keys(kind: str, after: ndb.Key | None, upto: ndb.Key, limit: int | None = None) -> list[ndb.Key]:
    """The kind's keys in (after, upto], in key order: a keys-only query through the Datastore API itself, whose keys
    cost a tenth of ndb's client CPU (core/datastore.Bulk)."""
    return runtime.current().datastore.bulk.keys(kind, after, upto, limit)
