"""The mapper's demo kind, and the results of auditing the figures the app keeps about it."""
from google.cloud import ndb

from core.markers import ExpiringMarker


class Account(ndb.Model):
    """A customer account. Written in transactions of a chunk of accounts each (seeding, the mapper's credit); neither
    cache, as for any kind that a batch job rewrites wholesale (the global cache would add a lock and a delete to every
    write)."""
    _use_cache = False
    _use_global_cache = False
    balance = ndb.IntegerProperty(default=0)  # indexed: what a SUM aggregation query reads (the aggregation lesson)
    # The seed call that created it: its retry after an UNKNOWN commit counts it as its own (service._create_missing).
    created_by = ndb.TextProperty()


class AccountsAudit(ndb.Model):
    """What the latest audit found beside what the app kept. One entity, key name LATEST, read by key: a query for the
    newest of many, even `limit 1`, cost the Firestore emulator more as the accounts grew."""
    LATEST = "latest"
    job = ndb.StringProperty(required=True)
    found_count = ndb.IntegerProperty(required=True, indexed=False)
    found_balance = ndb.IntegerProperty(required=True, indexed=False)
    kept_count = ndb.IntegerProperty(required=True, indexed=False)
    kept_balance = ndb.IntegerProperty(required=True, indexed=False)
    created = ndb.DateTimeProperty(auto_now=True, indexed=False)


class SeedMarker(ExpiringMarker):
    """A seed sent with an Idempotency-Key: its first answer, under the key's marker name."""
    _use_global_cache = False
