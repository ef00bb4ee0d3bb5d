"""Counter entities.

Every shard is a root entity, its own entity group: Datastore serializes transactions per entity group (about one
commit per second per group sustained in production), so a counter written by many clients at once must spread its
writes over many groups. A shard is never a child of its counter's config, which would put them all back in one group.
"""
import datetime

from google.cloud import ndb

SEPARATOR = "|"  # counter names never contain it (NAME_PATTERN), so "name|3" is unambiguous
# How long an Idempotency-Key is honoured at least (Stripe keeps its keys 24 hours:
# https://docs.stripe.com/api/idempotent_requests).
MARKER_LIFETIME = datetime.timedelta(days=1)


class CounterConfig(ndb.Model):
    """A named counter; key name is the counter's name.

    Read (by key) on every increment and total, written only when the counter is created or grows: the ndb global
    cache serves it from memcached. Never read inside an increment's transaction, so that growing the counter does not
    abort every increment in flight.
    No in-context cache: a long-lived context (a worker thread, a task) would keep the shard count it saw first and
    never spread over shards added since. memcached serves the repeat reads instead.
    """
    _use_cache = False
    mode = ndb.StringProperty(choices=("general", "adaptive"), required=True)
    num_shards = ndb.IntegerProperty(required=True, indexed=False)
    listed = ndb.BooleanProperty(default=True)  # False: kept by another feature (an entry's views), not listed
    created = ndb.DateTimeProperty(auto_now_add=True, indexed=False)

    @property
    def name(self):
        return self.key.id()


class CounterShard(ndb.Model):
    """One shard of a named counter; key name "<counter>|<index>". Uncached, as counters/simple.py's shards."""
    _use_cache = False
    _use_global_cache = False
    count = ndb.IntegerProperty(default=0, indexed=False)

    @staticmethod
    def key_for(name, index):
        return ndb.Key(CounterShard, f"{name}{SEPARATOR}{index}")


class AppliedIncrement(ndb.Model):
    """Marks an Idempotency-Key as applied to a counter; key name "<counter>|<idempotency key>".

    Written in the same transaction as the shard it increments, so the marker exists exactly when the increment does.
    Each marker is its own root entity: only retries of the same key ever contend on it.

    Markers expire: anyone may increment a counter with a fresh key, so markers kept for ever would let anonymous
    clients grow storage without bound. A key is honoured for MARKER_LIFETIME at least (a client retries within
    seconds), then the marker goes: in production by a TTL policy on `expires` (Firestore in Datastore mode, deleted
    typically within 24 hours of expiry: https://cloud.google.com/datastore/docs/ttl), and everywhere by the sweep
    (service.sweep_markers), which the emulators need since neither applies TTL policies.
    """
    _use_global_cache = False
    token = ndb.TextProperty()  # which call applied it, so that call's own retry still says "applied"
    # Midnight UTC, a day or two ahead: indexed for the sweep's query, and coarse on purpose. Index rows sort by value
    # then key, so one day's markers spread over their keys (random idempotency keys), where an exact timestamp would
    # put every new row at the end of the index: the hotspot Firestore documents as a limit of 500 writes a second
    # (https://cloud.google.com/firestore/docs/solutions/shard-timestamp; blog/production.py), while the counter's
    # shards take far more.
    expires = ndb.DateTimeProperty(required=True)

    @classmethod
    def new(cls, key: ndb.Key, token: str, now: datetime.datetime) -> "AppliedIncrement":
        day = (now + MARKER_LIFETIME).replace(hour=0, minute=0, second=0, microsecond=0)
        return cls(key=key, token=token, expires=day + datetime.timedelta(days=1))

    @staticmethod
    def key_for(name, idempotency_key):
        return ndb.Key(AppliedIncrement, f"{name}{SEPARATOR}{idempotency_key}")
