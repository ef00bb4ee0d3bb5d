"""The accounts' kept figures (accounts/service.py)."""
from google.cloud import ndb

from accounts import service
from counters import growth
from counters.models import CounterConfig


def test_keeping_the_figures_again_runs_no_transaction(ndb_context, monkeypatch):
    """keep_figures runs at every seed and credit job start: once the two counters exist with their shards, it reads
    them (one batched get) and writes nothing, so a start never waits on the counters' configs' transactions."""
    service.keep_figures()
    kept = service.COUNTERS.configs((service.COUNT, service.BALANCE))
    assert [c.num_shards for c in kept] == [service.KEPT_SHARDS] * 2

    def no_transaction(*args, **kwargs):
        raise AssertionError("a transaction for counters that exist")
    monkeypatch.setattr(growth, "transact", no_transaction)
    service.keep_figures()
    monkeypatch.undo()
    ndb.Key(CounterConfig, service.COUNTERS.name(service.BALANCE)).delete()  # gone: made again, in a transaction
    service.keep_figures()
    assert service.COUNTERS.configs((service.BALANCE,))[0].num_shards == service.KEPT_SHARDS
