"""One task of a mapper job, delivered by a queue at least once: the talk's "split big jobs into many small tasks".

The plain tree: a task scans its key range (lo, hi] in key order (one keys-only query; limit+offset would read every key
before its page: O(N^2) over a kind), keeps its first page (`page_size` keys), cuts the rest of its range into up to
`fanout` child ranges (a tree O(log N) deep), and does its page in chunks. Each chunk's transaction runs the job's map
step on its entities (add_credit's: each account's balance += amount) and moves the task's record past them, so each
entity is changed exactly once. The root's range: (None, the kind's largest key at the start] (children.root_payload).
Two optimisations. Handouts: the query reads on, and up to `fanout` pages after its own go ready-made to children,
saving their queries. Cut points: `__scatter__` samples' quantiles where the range holds enough (keyrange.py). Weight
only tells when the job has ended (the job's 2**62 is shared down the tree and comes back as tasks end: task.py,
completion.py); ignore it on a first read. Queue handler: delivery.py; the words, and why: docs/lessons/mapper.md."""
from typing import Any, NamedTuple

from google.cloud import ndb

from core.exactly_once import Written, once
from mapper import children, chunks, jobs, keyrange
from mapper.models import MapperJob
from mapper.task import TaskPage, TaskPayload, TaskRecord

Range = tuple[ndb.Key, ndb.Key]  # (lo, hi]: lo excluded


class Visit(NamedTuple):
    """What one delivery visits (`_visit`), in the order `process` uses it."""
    page: TaskPage  # its task's page: its first and last keys, fixed by the task's first chunk to commit
    todo: list[ndb.Key]  # the page's keys still to do
    children: list[TaskPayload]  # what this delivery split the rest of its range into, handouts with their keys


def process(job: MapperJob, definition: jobs.JobDefinition, record: TaskRecord, payload: TaskPayload,
            lease_seconds: int) -> TaskRecord:
    """One delivery's work on its task (`job`: this run of `definition`, the registered job); the record as it leaves it
    (`record`: as a redelivery read it, or new on a first delivery, which does not read it: delivery.py). `_visit` scans
    and `split`s, or goes on from the record; each chunk of the keys still to do commits once (`commit_chunk`). Only
    then are the children queued: a delivery that scans again may split differently (new keys, other cut points), so
    the first chunk to commit fixes the page and the children in the record, and the names queued are those."""
    visit = _visit(job, record, payload)
    work = chunks.page_work(definition, job.params, visit.todo)  # the keys cut into chunks, one transaction each
    for number, chunk in enumerate(work.chunks):  # one at least: an empty page is one empty chunk, to end the record
        record = commit_chunk(work, visit, payload, record, chunk, number == len(work.chunks) - 1, lease_seconds)
        if number == 0:  # this delivery's split, or an earlier delivery's as its record keeps it
            children.enqueue_all(visit.children or children.recorded(record))
    return record


def _visit(job: MapperJob, record: TaskRecord, payload: TaskPayload) -> Visit:
    """A range task's first delivery scans its range (lo, hi], lo exclusive (one keys-only query in key order) and
    splits; a redelivery reads the rest of the page fixed by its record, new keys in it too; a handout child, none."""
    if (handed := payload.handed_keys) is not None:  # a handout child: its page, as its parent scanned it
        todo = handed[handed.index(record.last_key) + 1:] if record.last_key else handed
        return Visit(record.page or TaskPage(handed[0], handed[-1], False), todo, [])
    if record.page is None:  # no chunk committed yet (a first delivery, or one after a delivery died before its first)
        limit = children.scan_limit(job.page_size, job.fanout)  # page_size x (fanout + 1) + 1: see `split`
        scanned = chunks.keys_in_range(job.kind, payload.lo_key, payload.hi_key, limit)  # keys only, in key order
        keys = scanned[:job.page_size]
        page = TaskPage(keys[0], keys[-1], len(scanned) > len(keys)) if keys else TaskPage(None, None, False)
        if not page.more:
            return Visit(page, keys, [])
        handouts, ranges = split(job, payload, scanned)  # each child then given its share of the weight (task.py)
        return Visit(page, keys, payload.make_children(handouts, ranges, record.weight, page_end=page.end))
    return Visit(record.page, chunks.keys_in_range(job.kind, record.last_key or payload.lo_key, record.page.end), [])


def split(job: MapperJob, payload: TaskPayload, scanned: list[ndb.Key]) -> tuple[list[list[ndb.Key]], list[Range]]:
    """The rest of the range after this task's page, for its children: (handouts, ranges). The plain tree: ranges, the
    rest cut into up to `fanout` (`keyrange.ranges`). Handouts first: the pages the scan read after its own, each to
    be given whole to a child (up to `fanout`, within children.HANDED_BYTES), so the ranges start after the last handed
    key. E.g. page_size 100, fanout 4: the scan reads 100 x (4 + 1) + 1 = 501 keys (scan_keys 500, and one more); the
    task keeps 100, hands out 4 pages, cuts (the 500th key, hi]."""
    size = job.page_size
    scan_keys = children.scan_limit(size, job.fanout) - 1  # keys of its page and `fanout` pages, without the one more
    handouts = children.cut_handouts(scanned[size:scan_keys], size)  # the pages scanned after its own
    own_and_handed = min(size * (1 + len(handouts)), len(scanned))  # keys of its own page plus those handed out
    ranges = []
    if len(scanned) > own_and_handed:  # keys are left: (the last key kept or handed out, hi]
        ranges = keyrange.ranges(scanned[own_and_handed - 1], payload.hi_key, first_scanned=scanned[0],
                                 own_and_handed=own_and_handed, scan_keys=scan_keys, fanout=job.fanout,
                                 samples=job.samples)
    return handouts, ranges


def commit_chunk(work: chunks.PageWork, visit: Visit, payload: TaskPayload, before: TaskRecord, chunk: list[ndb.Key],
                 final: bool, lease_seconds: int) -> TaskRecord:
    """Change the chunk's entities by the job's map step (`work.change`: add_credit's runs `credit`) and move the
    record past them, in one transaction, exactly once; `before` is the record as this delivery left it. `look` finds
    the record (1) not stored: no chunk of the task committed, `before` is new (delivery.py), (2) moved on, or gone:
    by this call's own commit, which answered UNKNOWN yet applied (MINE), or by another delivery (ANOTHERS: Superseded),
    or (3) as `before` left it: then `write` writes the chunk and the record, stamped. `work.store` is ndb (chunks.py),
    unless the job gives its change as increments (then protobufs: increments.py)."""
    def look() -> Written | tuple[TaskRecord, list[Any]]:
        current, *entities = work.store.get_multi([before.key] + chunk)  # no other task's: only this task's deliveries
        if current is None and before.never_committed:  # 1. not stored yet: the task's first chunk
            current = TaskRecord.new(before.key, payload)
        elif current is None or current.state != "running" or current.last_key != before.last_key:
            return Written(stamp=current and current.last_chunk_by, answer=current)  # 2. MINE, or ANOTHERS (or gone)
        return current, [e for e in entities if e is not None]  # 3. as `before` left it (deleted entities skipped)

    def write(read: tuple[TaskRecord, list[Any]], stamp: str) -> TaskRecord:
        current, entities = read
        current.started = current.started or before.started  # when the delivery that first commits began
        writes = work.change(entities)
        kept = children.kept_apart(current.key, visit.children) if current.page is None else []  # with the 1st chunk
        current.advance(page=visit.page, chunk=chunk, processed=len(entities), tally=work.tally(entities),
                        children=visit.children, final=final)
        current.renew(lease_seconds)  # this delivery is alive: the sweep leaves the task alone until then
        current.last_chunk_by = stamp
        work.store.put_multi([*writes, current, *kept])
        return current

    committed = once(look, write, run=work.store.transact)  # ndb's, or the Datastore API's for increments
    if committed.by_another:  # another delivery moved the record on
        raise Superseded()
    return committed.value  # WROTE or MINE: the record as this call's commit left it


class Superseded(Exception):
    """Another delivery moved the task's record on: this one stops (409); a later delivery resumes if that one died."""
