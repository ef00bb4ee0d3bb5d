"""Mapper data: a job's run and one record per task of its tree (entities), and what a task is given (TaskPayload).

No entity is written by many tasks: the job is written when it starts, when it ends and when it is cancelled; each
task writes only its own record (a root entity, its own entity group). The job's state and progress are derived from
the records, so a thousand tasks finishing at once contend on nothing.
"""
import dataclasses
import datetime

from google.cloud import ndb

from core import clock

# A job's credit: the root task holds all of it; a task that splits hands shares of its credit to its children and
# keeps one for its own page, which it returns when its page is done. The credits returned sum to TOTAL_CREDIT exactly
# when every task of the tree has finished. Integers, so the sum is exact (the splitter keeps the remainder).
TOTAL_CREDIT = 2 ** 62


@dataclasses.dataclass(frozen=True)
class TaskPayload:
    """What one task of a job's tree is given (its body in the queue, as JSON): the job's id, the task's path in the
    tree ("0", "0-2", "0-2-1": the root, its third child, ...), its credit, and what it visits: either a key range
    (lo, hi] as urlsafe keys (lo None: from the kind's first key), or `keys`, a page its parent listed."""
    job: str
    task: str
    lo: str | None
    hi: str | None
    credit: int
    keys: list[str] | None = None
    revived: int = 0  # queued again by the sweep (n-th time): a redelivery, under a new name (`queue_name`)

    @classmethod
    def from_json(cls, data: dict) -> "TaskPayload":
        return cls(job=data["job"], task=data["task"], lo=data.get("lo"), hi=data.get("hi"), credit=data["credit"],
                   keys=data.get("keys"), revived=data.get("revived") or 0)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def name(self) -> str:
        """The task's name in the queue, and its record's key name."""
        return f"{self.job}-{self.task}"

    @property
    def queue_name(self) -> str:
        """Its name in the queue: a queue keeps a used name for days (core/tasks.py), so the sweep's n-th delivery of
        the task is a task of its own, "<name>-r<n>"."""
        return f"{self.name}-r{self.revived}" if self.revived else self.name

    @property
    def depth(self) -> int:
        return self.task.count("-")

    @property
    def lo_key(self) -> ndb.Key | None:
        return _key(self.lo)

    @property
    def hi_key(self) -> ndb.Key | None:
        return _key(self.hi)

    @property
    def listed(self) -> list[ndb.Key] | None:
        return [_key(k) for k in self.keys] if self.keys is not None else None

    def child(self, index: int, lo: ndb.Key, hi: ndb.Key, credit: int) -> "TaskPayload":
        return TaskPayload(self.job, f"{self.task}-{index}", lo.urlsafe().decode(), hi.urlsafe().decode(), credit)

    def listed_child(self, index: int, keys: list[ndb.Key], credit: int) -> "TaskPayload":
        return TaskPayload(self.job, f"{self.task}-{index}", None, None, credit, [k.urlsafe().decode() for k in keys])


def summed(tally: dict, more: dict) -> dict:
    """Two tallies ({name: whole number}) added name by name."""
    return {name: tally.get(name, 0) + more.get(name, 0) for name in tally.keys() | more.keys()}


def _key(urlsafe: str | None) -> ndb.Key | None:
    return ndb.Key(urlsafe=urlsafe.encode()) if urlsafe else None


@dataclasses.dataclass(frozen=True)
class TaskPage:
    """The page a task fixed on its first delivery: its first and last keys, and whether keys remained after it."""
    start: ndb.Key | None
    end: ndb.Key | None
    more: bool


class MapperJob(ndb.Model):
    """A run of a registered job (mapper.jobs.JobDefinition) over every entity of its kind; key name is the run's
    id.

    Read by key by every task (the ndb global cache serves it from memcached); written when it starts, ends and is
    cancelled, and by its follow-up's sends and run (completion.py).
    """
    name = ndb.StringProperty(required=True)
    params = ndb.JsonProperty(default={})
    kind = ndb.TextProperty(required=True)
    page_size = ndb.IntegerProperty(required=True, indexed=False)
    fanout = ndb.IntegerProperty(required=True, indexed=False)
    last_key = ndb.KeyProperty(indexed=False)  # the kind's largest key when the job started: the root range's end
    samples = ndb.KeyProperty(repeated=True, indexed=False)  # __scatter__ samples, sorted by key order
    created = ndb.DateTimeProperty(auto_now_add=True)
    cancelled = ndb.BooleanProperty(default=False, indexed=False)
    # Set once, by whoever first sees every credit returned. Indexed: the sweep (mapper/sweep.py) lists the running
    # jobs (finished == None) to sum the records of one with no task at work.
    finished = ndb.DateTimeProperty()
    finished_by = ndb.TextProperty()  # which call set it: its own retry after an UNKNOWN commit still runs on_done
    outcome = ndb.TextProperty(choices=("done", "failed", "cancelled"))  # set with `finished`
    summary = ndb.JsonProperty()  # the job's figures when it finished: processed, tasks, depth, tally
    # The job's follow-up (JobDefinition.on_done), run exactly once by a task of its own: "pending" is written in the
    # finishing commit, "ran" in the commit of on_done's writes. Indexed: the sweep (mapper/sweep.py) looks for the
    # pending ones whose task has not reported by `follow_up_due`, and queues it again (`follow_up_sent`: how often).
    follow_up = ndb.StringProperty(choices=("pending", "ran"))
    follow_up_due = ndb.DateTimeProperty(indexed=False)
    follow_up_sent = ndb.IntegerProperty(default=0, indexed=False)
    follow_up_by = ndb.TextProperty()  # which call wrote it last (a sweep's send, or the run): its own retry knows

    @property
    def id(self) -> str:
        return self.key.id()


class TaskRecord(ndb.Model):
    """What one task of a job's tree did; key name is the task's name "<job>-<path>" (path "0", "0-2", "0-2-1": the
    root, its third child, ...). Written only by that task, in the same transaction as each chunk of its page, so
    the record says exactly which entities of the page were processed.

    Neither cache: a record is written by every chunk and read in its transaction, which skips the global cache, so
    that cache would only add a lock and a delete to each write.
    """
    _use_cache = False
    _use_global_cache = False
    job = ndb.StringProperty(required=True)
    depth = ndb.IntegerProperty(required=True, indexed=False)
    credit = ndb.IntegerProperty(required=True, indexed=False)
    state = ndb.TextProperty(default="running", choices=("running", "done", "failed"))
    page_end = ndb.KeyProperty(indexed=False)  # the last key of this task's page, fixed by its first chunk
    page_start = ndb.KeyProperty(indexed=False)  # and its first
    more = ndb.BooleanProperty(default=False, indexed=False)  # keys remained after the page
    last_key = ndb.KeyProperty(indexed=False)  # the last key processed so far
    # Which delivery's which chunk committed last: a chunk's own retry after an UNKNOWN commit finds itself there.
    last_chunk = ndb.TextProperty()
    processed = ndb.IntegerProperty(default=0, indexed=False)
    tally = ndb.JsonProperty(default={})  # the job's sums over the entities processed so far (JobDefinition.tally)
    # The payloads of the tasks it split into, enqueued again on a retry; a listed page's keys are in its TaskListing.
    children = ndb.JsonProperty(default=[])
    returned = ndb.IntegerProperty(default=0, indexed=False)  # credit returned when done: what children did not take
    error = ndb.TextProperty()
    # While it runs: until when the delivery that last committed is trusted to be alive (each chunk's commit renews
    # it); once ended, set only until the sweep has seen a record of each child (renew). Indexed: the sweep
    # (mapper/sweep.py) queries for leases run out.
    lease = ndb.DateTimeProperty()
    revived = ndb.IntegerProperty(default=0, indexed=False)  # how often the sweep queued the task again
    # Revivals since its last chunk committed: a delivery alive but slow (a chunk's transaction waiting on locks past
    # the lease) commits between two revivals and starts the count again; one that dies each time does not.
    fruitless = ndb.IntegerProperty(default=0, indexed=False)
    revived_by = ndb.TextProperty()  # which sweep call did last: its own retry after an UNKNOWN commit finds it
    started = ndb.DateTimeProperty(indexed=False)  # when its first delivery began (TaskRecord.new)
    # Its last chunk's commit, or its end (advance, hand_back): when it finished, once done; the timeline's bars end
    # here. Not auto_now: the sweep's writes (a lease cleared, a task taken up again) are not the task's work.
    updated = ndb.DateTimeProperty(indexed=False)

    @classmethod
    def new(cls, key: ndb.Key, payload: TaskPayload) -> "TaskRecord":
        now = clock.now()
        return cls(key=key, job=payload.job, depth=payload.depth, credit=payload.credit, started=now, updated=now)

    @property
    def page(self) -> TaskPage | None:
        return TaskPage(self.page_start, self.page_end, self.more) if self.page_end is not None else None

    @property
    def kept_credit(self) -> int:
        """The credit this task kept for its own page: what it did not hand to its children."""
        return self.credit - sum(child["credit"] for child in self.children or [])

    def advance(self, page: TaskPage, chunk: list, processed: int, tally: dict | None, children: list[TaskPayload],
                final: bool) -> None:
        """Move this record past `chunk`, inside that chunk's transaction: the page and the `children` the rest of
        the range splits into fixed (by its first chunk), the chunk's last key, `processed` entities more (those of
        the chunk that still existed), their `tally` added. `final`: the page's last chunk: the record is done and
        returns the credit it kept for its page."""
        if self.page_end is None:
            self.page_start, self.page_end, self.more = page.start, page.end, page.more
            self.children = [{**c.to_json(), "keys": None, "listed": c.keys is not None} for c in children]
        if chunk:
            self.last_key = chunk[-1]
        self.updated, self.fruitless = clock.now(), 0
        self.processed += processed
        if tally:
            self.tally = summed(self.tally or {}, tally)
        if final:
            self.state, self.returned = "done", self.kept_credit

    def renew(self, seconds: int) -> None:
        """The lease after a commit: `seconds` from now while running; once ended, the same if it has children (the
        sweep then checks once that each has a record: a child whose every delivery died before its first commit has
        none, and nothing else would ever run it), else none."""
        self.lease = (clock.now() + datetime.timedelta(seconds=seconds) if self.state == "running" or self.children
                      else None)


class TaskListing(ndb.Model):
    """The keys of the pages a task handed to its children ({child's path: urlsafe keys}), apart from its record: the
    job's records are read whole when it finishes, and stay small. A child entity of the record, so it is written in
    the record's first chunk's transaction without taking one more of the legacy emulator's 25 entity groups; read
    only to enqueue the children again."""
    _use_cache = False
    _use_global_cache = False
    pages = ndb.JsonProperty(default={})

    @classmethod
    def key_for(cls, record_key: ndb.Key) -> ndb.Key:
        return ndb.Key(cls, "pages", parent=record_key)
