"""The numbers page's entities: the probes it writes and reads, and its last measurement."""
from google.cloud import ndb


class Probe(ndb.Model):
    """A small entity that the measurement writes and reads. Never cached: the point is to time Datastore itself."""
    _use_cache = False
    _use_global_cache = False

    value = ndb.IntegerProperty(indexed=False)
    text = ndb.TextProperty()


class Measurement(ndb.Model):
    """The last measurement (id "latest"), read by key. Not in ndb's global cache: its writes would then fail while
    the cache is down, when measuring is most telling."""
    _use_global_cache = False

    measured = ndb.DateTimeProperty(indexed=False)
    by = ndb.TextProperty()  # the admin's display name (core.people.display_name), never an email
    backend = ndb.TextProperty()  # which datastore was measured: "legacy" or "firestore"
    backend_name = ndb.TextProperty()  # said in words: an emulator, or the real database
    runs = ndb.IntegerProperty(indexed=False)
    operations = ndb.JsonProperty()
    latency = ndb.TextProperty()  # "production" or "multi-region": measured under that latency profile (LATENCY)
