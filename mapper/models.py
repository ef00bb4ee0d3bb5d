"""Mapper entities: a job, and one record per task of its tree.

No entity is written by many tasks: the job is written when it starts, when it ends and when it is cancelled; each
task writes only its own record (a root entity, its own entity group). The job's state and progress are derived from
the records, so a thousand tasks finishing at once contend on nothing.
"""
from google.cloud import ndb

# A job's credit: the root task holds all of it; a task that splits hands its credit to its children, a task that does
# not returns it. The credits returned sum to TOTAL_CREDIT exactly when every task of the tree has finished. Integers,
# so the sum is exact (a split gives the remainder of the division to the first child).
TOTAL_CREDIT = 2 ** 62


class MapperJob(ndb.Model):
    """A run of a registered job over every entity of its kind; key name is the job's id.

    Read by key by every task (the ndb global cache serves it from memcached); written three times at most.
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
    finished = ndb.DateTimeProperty(indexed=False)  # set once, by whoever first sees every credit returned
    outcome = ndb.TextProperty()  # "done" or "failed", set with `finished`
    summary = ndb.JsonProperty()  # the job's figures when it finished: processed, tasks, depth, tally

    @property
    def id(self):
        return self.key.id()


class TaskRecord(ndb.Model):
    """What one task of a job's tree did; key name is the task's name "<job>-<path>" (path "0", "0-2", "0-2-1": the
    root, its third child, ...). Written only by that task, in the same transaction as each chunk of its page, so
    the record says exactly which entities of the page were processed.

    Neither cache: each write must land in Datastore now, and reads of it are queries or in-transaction gets.
    """
    _use_cache = False
    _use_global_cache = False
    job = ndb.StringProperty(required=True)
    depth = ndb.IntegerProperty(required=True, indexed=False)
    credit = ndb.IntegerProperty(required=True, indexed=False)
    state = ndb.TextProperty(default="running")  # running | done | failed
    page_end = ndb.KeyProperty(indexed=False)  # the last key of this task's page, fixed by its first chunk
    page_start = ndb.KeyProperty(indexed=False)  # and its first: how densely keys lie here, for splitting
    more = ndb.BooleanProperty(default=False, indexed=False)  # keys remained after the page
    last_key = ndb.KeyProperty(indexed=False)  # the last key processed so far
    processed = ndb.IntegerProperty(default=0, indexed=False)
    tally = ndb.JsonProperty(default={})  # the job's sums over the entities processed so far (Job.tally)
    children = ndb.JsonProperty(default=[])  # the payloads of the tasks it split into, enqueued again on a retry
    returned = ndb.IntegerProperty(default=0, indexed=False)  # credit returned: all of it if no children, else 0
    error = ndb.TextProperty()
    started = ndb.DateTimeProperty(auto_now_add=True, indexed=False)
    updated = ndb.DateTimeProperty(auto_now=True, indexed=False)
