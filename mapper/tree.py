"""One task of a mapper job: the talk's "split big jobs into many small tasks". A queue delivers it at least once.

A task, given a key range (lo, hi] (the root's: the kind's, up to its largest key when the job started), with the
job's `page_size` (100 by default) and `fanout` (4: up to 4 handouts and 4 ranges, so up to 8 children):
1. scans its range: one keys-only query in key order for its page and `fanout` pages more (not limit+offset: O(N^2));
2. keeps the first page, hands each page after it whole to a child (a handout: the child runs no query), and cuts the
   rest of its range into up to `fanout` child ranges, each a task that does the same: a tree O(log N) deep;
3. does its page in chunks. Each chunk's transaction runs the job's map step on its entities (add_credit's: balance
   += amount) and moves the task's record past them: each entity is changed exactly once, however often delivered.
Cut points: `__scatter__` quantiles (keyrange.py). Weight (task.py) only tells when the job has ended: skip it at first.
The queue's handler around this: delivery.py. The words, and why: docs/lessons/mapper.md."""
from typing import Any, NamedTuple

from google.cloud import ndb

from core.exactly_once import Written, once
from mapper import chunks, jobs, keyrange, queueing
from mapper.models import MapperJob
from mapper.task import Range, TaskPayload, TaskRecord


class Visit(NamedTuple):
    """What one delivery visits (`_visit`), in the order `process` uses it."""
    page_end: ndb.Key | None  # its task's page's last key (None: an empty page), fixed by the task's first commit
    todo: list[ndb.Key]  # the page's keys still to do
    children: list[TaskPayload]  # what this delivery split the rest of its range into, handouts with their keys


def process(job: MapperJob, definition: jobs.JobDefinition, record: TaskRecord, payload: TaskPayload) -> TaskRecord:
    """One delivery's work on its task (`job`: a run of `definition`): what to visit, each chunk committed once
    (`commit_chunk`), the children queued once the first commit has recorded them, and queued again from the record by
    each redelivery (named tasks: the queue drops a name it has seen). `record`: the task's record as this delivery
    knew it when it began (delivery.py reads it for a redelivery; a first delivery's is new and empty); another
    delivery, even another first one, may have moved it on since: `commit_chunk` reads it with each chunk."""
    visit = _visit(job, record, payload)
    work = chunks.page_work(definition, job.params, visit.todo)  # the keys cut into chunks, one transaction each
    for number, chunk in enumerate(work.chunks):  # one at least: an empty page is one empty chunk, to end the record
        record = commit_chunk(work, visit, payload, record, chunk, final=number == len(work.chunks) - 1)
        if number == 0:  # its first commit: the children it split into, or a redelivery's, those recorded
            queueing.enqueue_all(visit.children if visit.children else queueing.recorded(record))
    return record


def _visit(job: MapperJob, record: TaskRecord, payload: TaskPayload) -> Visit:
    """What this delivery visits: a handout child, its page (no query); a redelivery, the rest of the page its record
    fixed (new keys in it too); a range task's first delivery, what it scans, and its split."""
    if payload.handed_keys is not None:  # a handout child: its page as its parent scanned it, no query
        return _visit_handout(record, payload.handed_keys)
    if record.page_end is not None:  # a chunk committed already: the rest of the page, after the record's last key
        after = record.last_key or payload.lo_key
        return Visit(record.page_end, chunks.keys_in_range(job.kind, after, record.page_end), [])
    limit = chunks.scan_limit(job.page_size, job.fanout)  # its page, `fanout` pages to hand out, one key more
    scanned = chunks.keys_in_range(job.kind, payload.lo_key, payload.hi_key, limit)  # 1. the scan
    keys = scanned[:job.page_size]  # 2. its page
    page_end = keys[-1] if keys else None
    if len(scanned) == len(keys):  # no key after its page: nothing to split
        return Visit(page_end, keys, [])
    handouts, ranges = split(job, payload, scanned)  # 2. the rest, to children
    return Visit(page_end, keys, payload.make_children(handouts, ranges, after=page_end))


def _visit_handout(record: TaskRecord, handed: list[ndb.Key]) -> Visit:
    todo = handed[handed.index(record.last_key) + 1:] if record.last_key else handed
    return Visit(record.page_end or handed[-1], todo, [])


def split(job: MapperJob, payload: TaskPayload, scanned: list[ndb.Key]) -> tuple[list[list[ndb.Key]], list[Range]]:
    """The rest of the range after this task's page, for its children: (handouts, ranges). At page_size 100, fanout 4,
    the scan read k1 .. k501: the task keeps k1 .. k100; handouts, k101 .. k200, ..., k401 .. k500, each given whole
    to a child; ranges, (k500, hi] cut in up to 4 (how many, and where: `keyrange.ranges`, a second read). Fewer
    handouts when their keys pass queueing.HANDED_BYTES: the keys not handed out go to the ranges."""
    size, scan_keys = job.page_size, chunks.scan_keys(job.page_size, job.fanout)  # 100, and 500: 5 pages of 100
    handouts = queueing.cut_handouts(scanned[size:scan_keys], size)  # k101 .. k500 (k501 only says more remain)
    own_and_handed = min(size * (1 + len(handouts)), len(scanned))  # 500: k1 .. k500, done by it and its handouts
    ranges = []
    if len(scanned) > own_and_handed:  # keys are left: (k500, hi], judged by the 500 keys read
        ranges = keyrange.ranges(scanned[own_and_handed - 1], payload.hi_key, first_scanned=scanned[0],
                                 own_and_handed=own_and_handed, scan_keys=scan_keys, fanout=job.fanout,
                                 samples=job.samples)
    return handouts, ranges


def commit_chunk(work: chunks.PageWork, visit: Visit, payload: TaskPayload, seen: TaskRecord, chunk: list[ndb.Key],
                 final: bool) -> TaskRecord:
    """Change the chunk's entities by the job's map step (`work.change`: add_credit's `credit`) and move the record
    past them, in one transaction, exactly once (`once`: `look`, then `write`). `seen`: the task's record as this
    delivery last saw it: as `process` had it (a first delivery's: new, empty), then as its last commit left it."""
    def look() -> Written | tuple[TaskRecord, list[Any]]:
        """The record, read with the chunk, and what `once` makes of it:
        - not stored yet (this task's first chunk), or as `seen`: nothing written, `write` (WROTE);
        - moved on since `seen`, by this call's own commit that answered UNKNOWN or timed out (its stamp): MINE;
        - moved on by another delivery (another stamp): ANOTHERS, and this delivery stops (Superseded).
        "Moved on": its `last_key` is not `seen`'s, or it has ended (a rival's commit of an empty page ends it)."""
        stored, *entities = work.store.get_multi([seen.key] + chunk)  # as stored now: only this task's deliveries
        if stored is None:  # not stored yet: this task's first chunk (the app deletes no record)
            stored = TaskRecord.new(seen.key, payload)
        elif stored.state != "running" or stored.last_key != seen.last_key:  # moved on since `seen`
            return Written(stamp=stored.last_chunk_by, answer=stored)
        return stored, [e for e in entities if e is not None]  # as `seen` (deleted entities skipped)

    def write(read: tuple[TaskRecord, list[Any]], stamp: str) -> TaskRecord:
        stored, entities = read
        first = stored.page_end is None  # this chunk fixes the page and the children
        writes = work.change(entities)
        stored.advance(page_end=visit.page_end, chunk=chunk, processed=len(entities), tally=work.tally(entities),
                       children=visit.children, final=final, started=seen.started)
        kept = queueing.kept_apart(stored.key, visit.children) if first else []  # handout keys beside the record
        stored.last_chunk_by = stamp  # the stamp `once` compares with its call's, on a retry
        work.store.put_multi([*writes, stored, *kept])
        return stored

    committed = once(look, write, run=work.store.transact)  # add_credit's: ndb's `transact` (chunks.NdbStore)
    if committed.by_another:  # another delivery moved the record on (its stamp is not this call's)
        raise Superseded()
    return committed.value  # WROTE or MINE: the record as this call's commit left it


class Superseded(Exception):
    """Another delivery moved the task's record on: this one stops (409); a later one resumes, or finds it ended."""
