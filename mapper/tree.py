"""The mapper's tree of tasks over key ranges: one task of a job, delivered by a queue at least once.

A task lists the first pages of its key range (keys only, in key order) in one query; it keeps the first page, hands
each page after it to a child, and splits what lies beyond into up to `fanout` ranges, each a child too. It then
processes its page in chunks, a transaction each; the first chunk's commit records the children, which are enqueued
at once while the task goes on with its page. The tree is O(log N) deep and keeps as many workers
busy as the queue has. Never limit+offset: an offset query reads and skips every entity before the page, so walking
N entities that way reads O(N^2) (bench/mapper.py measures it).

Exactly once: each chunk's writes and the task's record (how far its page got) commit in one transaction, so a task
that dies half way is retried from where its record says, and a second delivery of the same task finds the record
moved on and steps back. The record keeps the children it split into from its first chunk on; a retry enqueues those
same named tasks again, which every queue ignores (core/tasks.py), so a retry never splits twice. Each chunk's commit
also renews the record's lease: a task whose last allowed delivery died is queued again by the sweep (sweep.py) as
one more redelivery (`TaskPayload.revived`), which goes on from the record the same way.

No hot entity: a chunk's transaction writes its entities and its own task's record, nothing another task writes, so
concurrent tasks never collide with each other. What a job adds up over its entities (its tally: a credit job's total
credit) is kept in each task's record and summed once, when the last credit comes back (completion.py).
"""
import functools
import itertools
import logging
import uuid
from typing import Any

from google.cloud import ndb

from core import clock, runtime, tasks
from core.errors import Conflict
from core.transactions import transact
from mapper import completion, jobs, keyrange
from mapper.models import TOTAL_CREDIT, MapperJob, TaskListing, TaskPage, TaskPayload, TaskRecord

log = logging.getLogger(__name__)

KEY = ndb.model.ModelKey()  # the __key__ pseudo-property, for filters and sort orders on keys
TASK_HANDLER = "mapper.run"
# At most this many bytes of urlsafe keys go into the pages one task hands out, all its pages together: so that each
# child's task, which carries one page, is surely under the smallest task limit (100 KB for App Engine queues in the
# older API; a Cloud Tasks task takes 1 MB, https://cloud.google.com/tasks/docs/quotas), and the task's TaskListing,
# which keeps them all, far under an entity's 1 MiB. Accounts' keys take about 30 bytes; a kind with long key names
# hands out fewer pages and splits the rest as ranges.
LISTED_BYTES = 90_000


class Superseded(Exception):
    """Another delivery of the same task moved its record on: this one must stop and let the queue try later."""


def enqueue(payload: TaskPayload) -> None:
    runtime.tasks().enqueue(TASK_HANDLER, payload.to_json(), payload.queue_name)


def payload_of(job: MapperJob, record: TaskRecord) -> TaskPayload:
    """What the task of `record` was given: the root's from the job, any other's from its parent's record (and the
    parent's TaskListing for a listed page), where the parent fixed it before enqueueing it. For the sweep, which
    queues a task again knowing only its record."""
    path = record.key.id().split("-", 1)[1]
    if path == "0":
        return TaskPayload(job.id, "0", None, job.last_key.urlsafe().decode() if job.last_key else None, TOTAL_CREDIT)
    parent_key = ndb.Key(TaskRecord, f"{job.id}-{path.rsplit('-', 1)[0]}")
    child = next(c for c in parent_key.get().children if c["task"] == path)
    if child.get("listed"):
        child = {**child, "keys": TaskListing.key_for(parent_key).get().pages[path]}
    return TaskPayload.from_json(child)


def run_task(body: dict[str, Any], attempt: int = 0) -> dict[str, Any]:
    """One task of a job's tree (delivered by a queue, at least once; `attempt`: how many deliveries of it failed
    before this one, core/tasks.py). Returns what it did."""
    payload = TaskPayload.from_json(body)
    job = MapperJob.get_by_id(payload.job)
    if job is None or job.finished:
        return {"skipped": "the job is gone or finished"}
    definition = jobs.of(job)
    record_key = ndb.Key(TaskRecord, payload.name)
    if job.cancelled:
        # The rest of this task's range is left unvisited and its credit handed back, so that the job still ends and
        # settles what its tasks did before the cancel.
        record, returned_here = hand_back(record_key, payload, "done")
    else:
        record, returned_here = _run(job, definition, record_key, payload, attempt)
    if record.returned:
        # Every delivery that sees the record finished calls maybe_finish, but only the one that finished it passes
        # its credit. Any other passes 0: it cannot know whether the finishing delivery lived to add its credit to the
        # cache's running sum, and maybe_finish then sums the records instead.
        completion.maybe_finish(job, returned_here)
    return {"processed": record.processed, "children": len(record.children)}


def _run(job: MapperJob, definition: jobs.JobDefinition | None, record_key: ndb.Key, payload: TaskPayload,
         attempt: int) -> tuple[TaskRecord, int]:
    """This delivery's work on its task: (the record as it left it, the credit it returned)."""
    # A first delivery (attempt 0) does not look for its record: its first chunk's transaction writes it, and finds
    # it there if another delivery got there first (then this one steps back and is retried as attempt 1+, which
    # reads the record first). One lookup fewer per task. The sweep's deliveries are redeliveries: they read it.
    record = (record_key.get() if attempt or payload.revived else None) or TaskRecord.new(record_key, payload)
    record.started = record.started or clock.now()  # a record written before any delivery began has none yet
    if record.state != "running":
        _enqueue_children(record)  # the delivery that finished it may have died before enqueueing them
        return record, 0  # only the delivery that finished the record returned its credit
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


def _page_query(kind: str, after: ndb.Key | None, upto: ndb.Key) -> ndb.Query:
    query = ndb.Query(kind=kind).filter(KEY <= upto)
    if after is not None:
        query = query.filter(KEY > after)
    return query.order(KEY)


def _process(job: MapperJob, definition: jobs.JobDefinition, record: TaskRecord, payload: TaskPayload) -> TaskRecord:
    """Process this task's page in chunks; the final record.

    A range task's first delivery lists the first `fanout` + 1 pages of its range in one query: it keeps the first
    page, hands each other page whole to a child (whose payload carries its keys: it runs no query; as many pages as
    LISTED_BYTES of keys hold), and splits what lies beyond the pages it handed out into up to `fanout` ranges, each
    a child that does the same. So a job runs about one query per `fanout` + 1 pages: fewer RPCs, and fewer of them
    that must wait for one another.

    The page's first chunk also records the children, and they are enqueued as soon as it commits, while this task
    goes on with its page: the tree grows one query and one commit per level, not one whole page per level, so a
    job's critical path (the RPCs that must follow one another) is its depth in short steps plus one page. Each task
    keeps a share of its credit for its own page and hands the rest to its children: the credit comes back whole only
    when every page, the splitters' own included, is done."""
    page, children = record.page, []
    given = payload.listed  # the page's keys, when the parent listed this task's page for it
    if given is not None:  # no query: the rest of the page after the last key done
        keys = given[given.index(record.last_key) + 1:] if record.last_key else given
        page = page or TaskPage(given[0], given[-1], False)
    elif page is None:  # a range task's first delivery: list its page and the pages after it in one query
        listed = _page_query(job.kind, payload.lo_key, payload.hi_key).fetch(
            job.page_size * (job.fanout + 1) + 1, keys_only=True)  # one key more says whether any remain
        keys = listed[:job.page_size]
        page = TaskPage(keys[0], keys[-1], len(listed) > len(keys)) if keys else TaskPage(None, None, False)
        children = _split(job, payload, listed, record.credit) if page.more else []
    else:  # a retry: the rest of the page its first delivery fixed
        keys = _page_query(job.kind, record.last_key or payload.lo_key, page.end).fetch(job.page_size,
                                                                                       keys_only=True)
    prepared = definition.prepare(keys, job.params) if definition.prepare else None
    size = jobs.chunk(definition)
    # An empty page still commits one empty chunk: the record must be written, done, with its children.
    chunks = [keys[i:i + size] for i in range(0, len(keys), size)] or [[]]
    listed_pages = {child.task: child.keys for child in children if child.keys is not None}

    delivery = uuid.uuid4().hex
    lease = runtime.current().settings.mapper_lease_seconds

    # `record` below is this delivery's latest copy: the loop at the end rebinds it to each chunk's committed record.
    def txn(number: int, chunk: list[ndb.Key], expected_last_key: ndb.Key | None, final: bool) -> TaskRecord:
        # One lookup for the record and the chunk: entities no other task's transaction touches (each task has its
        # own key range and its own record), so chunks of concurrent tasks never collide.
        current, *entities = ndb.get_multi([record.key] + chunk)
        if current is not None and current.last_chunk == f"{delivery}:{number}":
            # This chunk's own commit applied, though it answered UNKNOWN: go on from it. What was to follow that
            # commit (a counter's cached total dropped by add_in_transaction) did not run: that total corrects itself
            # when its cached copy expires.
            return current
        if current is None and expected_last_key is None and record.page_end is None:  # no delivery wrote it yet
            current = TaskRecord.new(record.key, payload)
            current.started = record.started  # when this delivery began, before its page query
        elif current is None or current.state != "running" or current.last_key != expected_last_key:
            raise Superseded()
        if current.started is None:  # written before any delivery (the root's with its job, the sweep's): begun now
            current.started = record.started
        entities = [e for e in entities if e is not None]  # deleted since the query: skipped
        writes = definition.apply(entities, job.params, prepared) if entities else []
        tally = definition.tally(entities, job.params) if definition.tally and entities else None
        first = current.page_end is None  # this chunk fixes the page and the children: their listing goes with it
        listing = ([TaskListing(key=TaskListing.key_for(current.key), pages=listed_pages)]
                   if first and listed_pages else [])
        current.advance(page, chunk, len(entities), tally, children, final)
        current.renew(lease)  # this delivery is alive: the sweep leaves the task alone until the lease runs out
        current.last_chunk = f"{delivery}:{number}"
        ndb.put_multi([*writes, current, *listing])
        return current

    for number, chunk in enumerate(chunks):
        record = transact(functools.partial(txn, number, chunk, record.last_key, number == len(chunks) - 1))
        if number == 0:  # the split is recorded (by this delivery or an earlier one): the children start now
            _enqueue_children(record, listed_pages if children else None)
    return record


def _enqueue_children(record: TaskRecord, pages: dict[str, list[str]] | None = None) -> None:
    """Enqueue the tasks `record` split into, a listed page's keys from `pages` (else from the task's TaskListing); a
    repeat (a retry's) is dropped by the queue, which knows their names."""
    if pages is None:
        listing = TaskListing.key_for(record.key).get() if any(c.get("listed") for c in record.children) else None
        pages = listing.pages if listing else {}
    for child in record.children:
        if child.get("listed"):  # its page's keys are kept apart from the record
            child = {**child, "keys": pages[child["task"]]}
        enqueue(TaskPayload.from_json(child))


def _split(job: MapperJob, payload: TaskPayload, listed: list[ndb.Key], credit: int) -> list[TaskPayload]:
    """Split the rest of the range, after this task's own page, into child tasks; returns their payloads: the pages
    `listed` after its own, each handed whole to a child (as long as their keys fit LISTED_BYTES), then, if keys
    remain after those, up to `fanout` ranges (one when the range cannot split). Each child gets an equal share of
    `credit`, and the task keeps one share and the remainder for its own page. When the credit is too finely divided
    for that, one child takes the whole rest as a range, with half the credit."""
    size, listed_max = job.page_size, job.page_size * (job.fanout + 1)  # listed_max: the most keys one task lists
    pages: list[list[ndb.Key]] = []
    used = 0
    for i in range(size, min(len(listed), listed_max), size):
        used += sum(len(key.urlsafe()) for key in listed[i:i + size])
        if used > LISTED_BYTES:
            break
        pages.append(listed[i:i + size])
    keys_covered = min(size * (len(pages) + 1), len(listed))  # by the task's own page and the pages handed out
    ranges = []
    if len(listed) > keys_covered:  # keys remain after them
        end, hi = listed[keys_covered - 1], payload.hi_key
        parts = keyrange.parts_needed(page_start=listed[0], page_end=end, hi=hi, page_len=keys_covered,
                                      per_task=listed_max, k=job.fanout, samples=job.samples)
        bounds = [end] + (keyrange.split_points(end, hi, parts, job.samples, listed[0]) if parts > 1 else []) + [hi]
        ranges = list(itertools.pairwise(bounds))
    share = credit // (len(pages) + len(ranges) + 1)
    if share == 0:  # credit too finely divided for this split (a long chain of ranges that could not split)
        if credit < 2:  # no credit to hand on: the job fails rather than finish with this range unvisited
            raise RuntimeError(f"task {payload.task}: its credit is spent and its range is not")
        return [payload.child(0, listed[size - 1], payload.hi_key, credit // 2)]  # one child re-lists the rest
    return ([payload.listed_child(i, keys, share) for i, keys in enumerate(pages)] +
            [payload.child(len(pages) + i, lo, hi, share) for i, (lo, hi) in enumerate(ranges)])


def hand_back(record_key: ndb.Key, payload: TaskPayload, state: str,
               error: str | None = None) -> tuple[TaskRecord, int]:
    """End a task's record without visiting the rest of its page (its job is cancelled, or the task failed for good):
    `state`, and the credit it kept for its page returned, so the job still ends when every other task has. What its
    chunks committed before stays in the record's tally; children it recorded are enqueued (again: a delivery may
    have died before it did) and return their own credit. Returns the record and the credit this call returned (0
    when another delivery ended the record first)."""
    def txn() -> tuple[TaskRecord, int]:
        record = record_key.get(retries=0) or TaskRecord.new(record_key, payload)
        if record.state != "running":
            return record, 0
        record.state, record.error, record.updated = state, error, clock.now()
        record.returned = record.kept_credit
        record.renew(runtime.current().settings.mapper_lease_seconds)  # ended: a lease only to check its children
        record.put()
        return record, record.returned
    record, returned = transact(txn)
    _enqueue_children(record)
    return record, returned


