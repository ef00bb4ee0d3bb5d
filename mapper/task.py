"""One task of a mapper job's tree: what it is given (TaskPayload: its range, or a handout's keys) and what it did
(TaskRecord, an entity written with each chunk: its page, how far it got, its children). For later: weight,
only for the job's end. The root holds TOTAL_WEIGHT, a task that splits gives each child a share and keeps the rest,
returned when it ends; the job has ended when the returned weights sum to TOTAL_WEIGHT (completion.py sums them)."""
import dataclasses
import datetime

from google.cloud import ndb

from core import clock, runtime

TOTAL_WEIGHT = 2 ** 62  # weight-throwing termination detection (Huang 1989): completion.py
Range = tuple[ndb.Key, ndb.Key]  # (lo, hi]: lo excluded


@dataclasses.dataclass(frozen=True)
class TaskPayload:
    """A task's body in the queue: its job, its path ("0" the root, "0-2" its third child), its weight, and what it
    visits: a range (lo, hi] or a handout's `keys`, urlsafe for JSON (code reads `lo_key`, `hi_key`, `handed_keys`)."""
    job: str
    path: str
    lo: str | None
    hi: str | None
    weight: int  # for the job's end only (the module's docstring): skip it on a first read
    keys: list[str] | None = None
    revived: int = 0  # queued again by the sweep (n-th time): a redelivery, under a new name (`queue_name`)

    @property
    def name(self) -> str:
        """The task's name in the queue, and its record's key name."""
        return f"{self.job}-{self.path}"

    @property
    def lo_key(self) -> ndb.Key | None:
        return ndb.Key(urlsafe=self.lo.encode()) if self.lo else None

    @property
    def hi_key(self) -> ndb.Key:
        assert self.hi is not None, f"task {self.path} is a handout: it has no range"
        return ndb.Key(urlsafe=self.hi.encode())

    @property
    def handed_keys(self) -> list[ndb.Key] | None:
        """The keys of the page its parent handed it, or None for a range task."""
        return [ndb.Key(urlsafe=k.encode()) for k in self.keys] if self.keys is not None else None

    # ---- Not the first read: the children, with their shares of weight; the sweep's queue name; the JSON form. ----
    def make_children(self, handouts: list[list[ndb.Key]], ranges: list[Range], *,
                      after: ndb.Key) -> list["TaskPayload"]:
        """A split's children ("<path>-0"...), which cover (after, hi]: one per handout, then one per range, each with
        an equal share of this task's weight (`shares`: too little left, one range child takes the rest)."""
        handouts, ranges, share = shares(self.weight, handouts, ranges, (after, self.hi_key), self.path)
        return ([TaskPayload(self.job, f"{self.path}-{i}", None, None, share, [k.urlsafe().decode() for k in keys])
                 for i, keys in enumerate(handouts)] +
                [TaskPayload(self.job, f"{self.path}-{len(handouts) + i}", lo.urlsafe().decode(),
                             hi.urlsafe().decode(), share) for i, (lo, hi) in enumerate(ranges)])

    @property
    def queue_name(self) -> str:
        """A queue keeps a used name for days (core/tasks.py): the sweep's n-th delivery is "<name>-r<n>"."""
        return f"{self.name}-r{self.revived}" if self.revived else self.name

    @classmethod
    def from_json(cls, data: dict) -> "TaskPayload":
        return cls(job=data["job"], path=data["path"], lo=data.get("lo"), hi=data.get("hi"),
                   weight=data["weight"], keys=data.get("keys"), revived=data.get("revived") or 0)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class TaskRecord(ndb.Model):
    """What one task did; key name "<job>-<path>". Written in each chunk's transaction, so it says exactly which keys
    were processed. A root entity: tasks share no entity group. Neither cache: read in its transaction, which skips
    the global cache."""
    _use_cache = False
    _use_global_cache = False
    # The lesson's fields (tree.py): whose task, its page, how far it got and by whose commit, its tally, its children.
    job = ndb.StringProperty(required=True)
    state = ndb.TextProperty(default="running", choices=("running", "done", "failed"))
    page_end = ndb.KeyProperty(indexed=False)  # the page's last key, fixed by the first chunk (None: not yet, or empty)
    last_key = ndb.KeyProperty(indexed=False)  # the last key processed so far
    last_chunk_by = ndb.TextProperty()  # the stamp of the chunk committed last
    processed = ndb.IntegerProperty(default=0, indexed=False)
    tally = ndb.JsonProperty(default={})  # the job's sums over the entities processed so far (JobDefinition.tally)
    children = ndb.JsonProperty(default=[])  # its children's payloads (a handout's keys: in queueing.KeptHandouts)
    error = ndb.TextProperty()

    @classmethod
    def new(cls, key: ndb.Key, payload: TaskPayload) -> "TaskRecord":
        return cls(key=key, job=payload.job, depth=payload.path.count("-"), weight=payload.weight, updated=clock.now())

    def advance(self, page_end: ndb.Key | None, chunk: list, processed: int, tally: dict | None,
                children: list[TaskPayload], final: bool, started: datetime.datetime | None) -> None:
        """Move the record past `chunk`, in its transaction (the first also fixes the page and `children`); `final`:
        the page is done. Then what the sweep and the timeline keep with each commit (`_touch`)."""
        if self.page_end is None:
            self.page_end = page_end
            # A handout's keys are written beside the record (queueing.kept_apart, the same commit), not in it.
            self.children = [{**c.to_json(), "keys": None, "keys_apart": c.keys is not None} for c in children]
        if chunk:
            self.last_key = chunk[-1]
        self.processed += processed
        if tally:
            self.tally = summed(self.tally or {}, tally)
        if final:
            self.state = "done"
        self._touch(started)

    # ---- Not the first read: from here on, the job's end (weight), the sweep's fields, the /jobs page's. ----
    # The job's end: weight = own_share + its children's shares.
    weight = ndb.IntegerProperty(required=True, indexed=False)  # its parent's share
    # Once it has ended: its own share (what no child took), for the job's end to sum. Computed: no code sets it.
    returned = ndb.ComputedProperty(lambda self: 0 if self.state == "running" else self.own_share, indexed=False)
    # The sweep's (sweep.py). lease: until when its delivery is trusted to be alive; indexed, for the sweep's query.
    lease = ndb.DateTimeProperty()
    revived = ndb.IntegerProperty(default=0, indexed=False)  # how often the sweep queued the task again
    fruitless = ndb.IntegerProperty(default=0, indexed=False)  # revivals since its last chunk committed
    revived_by = ndb.TextProperty()  # the stamp of the sweep's call that revived it last
    recorded_by = ndb.TextProperty()  # the stamp of the sweep's call that recorded it, when its deliveries never did
    depth = ndb.IntegerProperty(required=True, indexed=False)  # the /jobs page's: its depth in the tree (0: the root)
    started = ndb.DateTimeProperty(indexed=False)  # the timeline's (/jobs/<id>): when its first delivery began
    updated = ndb.DateTimeProperty(indexed=False)  # its last chunk's commit, or its end: the timeline's bar ends here

    @property
    def own_share(self) -> int:
        """The weight this task kept for its own page: what it did not hand to its children."""
        return self.weight - sum(child["weight"] for child in self.children or [])

    def _touch(self, started: datetime.datetime | None) -> None:
        """With each commit: the lease renewed as the delivery is alive (sweep.py); its times (the timeline)."""
        self.started = self.started or started
        self.updated, self.fruitless = clock.now(), 0
        self.renew()

    def renew(self) -> None:
        """The lease after a commit: `mapper_lease_seconds` on while running, or ended with children the sweep checks
        (sweep.py); else none."""
        seconds = runtime.current().settings.mapper_lease_seconds
        self.lease = (clock.now() + datetime.timedelta(seconds=seconds) if self.state == "running" or self.children
                      else None)


def summed(tally: dict, more: dict) -> dict:
    return {name: tally.get(name, 0) + more.get(name, 0) for name in tally.keys() | more.keys()}


def shares(weight: int, handouts: list[list[ndb.Key]], ranges: list[Range], rest: Range,
           path: str) -> tuple[list[list[ndb.Key]], list[Range], int]:
    """Weight, for the job's end: (handouts, ranges, each child's equal share); its own: a share and the remainder.
    Shared 9 ways at fanout 4, 2**62 lasts 19 levels; past them, one range child takes half: `rest`, (page end, hi]."""
    if share := weight // (len(handouts) + len(ranges) + 1):
        return handouts, ranges, share
    if weight < 2:
        raise RuntimeError(f"task {path}: its weight is spent and its range is not")
    return [], [rest], weight // 2
