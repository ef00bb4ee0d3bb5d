"""The mapper's demo kind."""
from google.cloud import ndb


class Account(ndb.Model):
    """A customer account. Written by the mapper in transactions of a chunk of accounts each; neither cache, as for
    any kind that a batch job rewrites wholesale (the global cache would add a lock and a delete to every write)."""
    _use_cache = False
    _use_global_cache = False
    balance = ndb.IntegerProperty(default=0)  # indexed: the summary sums it with a projection query
