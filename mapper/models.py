"""A mapper job's run (MapperJob). No entity is written by many tasks: the job is written when it starts, ends or is
cancelled, each task writes only its own record (task.py), so a thousand tasks ending at once contend on nothing."""
from google.cloud import ndb

from core import idempotency


class MapperJob(idempotency.Marker):
    """A run of a registered job over every entity of its kind; read by key by every task (from ndb's global cache).
    Its own start's idempotency marker: `call` the stamp of the start that inserted it."""
    name = ndb.StringProperty(required=True)
    params = ndb.JsonProperty(default={})
    kind = ndb.TextProperty(required=True)
    page_size = ndb.IntegerProperty(required=True, indexed=False)
    fanout = ndb.IntegerProperty(required=True, indexed=False)
    kind_end = ndb.KeyProperty(indexed=False)  # the kind's largest key when the job started, the root range's end
    samples = ndb.KeyProperty(repeated=True, indexed=False)  # __scatter__ samples, sorted by key order
    created = ndb.DateTimeProperty(auto_now_add=True)
    cancelled = ndb.BooleanProperty(default=False, indexed=False)
    ended = ndb.DateTimeProperty()  # indexed: the sweep queries the running jobs (ended == None)
    ended_by = ndb.TextProperty()  # the stamp of the call that ended it
    outcome = ndb.TextProperty(choices=("done", "failed", "cancelled"))  # set with `ended`
    summary = ndb.JsonProperty()  # the job's figures when it ended: processed, tasks, depth, tally, revived
    # Its follow-up (JobDefinition.on_done): "pending" written in the commit that ends the job, "ran" with on_done's
    # writes. Indexed: the sweep queues a pending one again once `follow_up_due` has passed.
    follow_up = ndb.StringProperty(choices=("pending", "ran"))
    follow_up_due = ndb.DateTimeProperty(indexed=False)
    follow_up_sent = ndb.IntegerProperty(default=0, indexed=False)
    resent_by = ndb.TextProperty()  # one stamp per writer (core.exactly_once.once): the sweep's latest send,
    ran_by = ndb.TextProperty()  # and the run's commit

    @property
    def id(self) -> str:
        return self.key.id()
