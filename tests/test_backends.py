"""What differs between the two backends, checked on both whichever one the suite runs on: server-side increments are
applied by Firestore in Datastore mode and never counted where the backend drops them (the legacy emulator); only
the legacy emulator limits a transaction to 25 entity groups; only Firestore answers aggregation queries."""
import concurrent.futures
import datetime
import uuid

import pytest
from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import idempotency, runtime
from core.datastore import ServerIncrements
from counters.models import AppliedIncrement, CounterShard
from main import create_app
from mapper import increments
from tests.support import running, settings_for


def _app(stack):
    namespace = f"t{uuid.uuid4().hex[:16]}"
    return create_app(settings_for(stack, DATASTORE_NAMESPACE=namespace), TESTING=True)


def test_firestore_applies_server_increments_exactly_and_a_marker_makes_one_happen_once(firestore_stack):
    with running(_app(firestore_stack)):
        increments = runtime.current().datastore.increments
        assert isinstance(increments, ServerIncrements)
        with runtime.current().context():
            key = CounterShard.key_for("blind", 0)
            CounterShard(key=key, count=5).put()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                values = list(pool.map(lambda _: increments.commit(key, "count"), range(80)))
            assert sorted(values) == list(range(6, 86))  # each commit saw its own increment applied
            assert key.get(use_cache=False).count == 85
            request = idempotency.keyed("k1", "u1", "counters.increment", "blind", None)
            marker = AppliedIncrement.new(AppliedIncrement.key_for(request), request, "mine",
                                          {"attempts": 1, "shard": 0})
            assert increments.commit(key, "count", 1, insert=marker) == 86
            with pytest.raises(core_exceptions.AlreadyExists):
                increments.commit(key, "count", 1, insert=marker)
            assert key.get(use_cache=False).count == 86  # the refused commit wrote nothing
            stored = AppliedIncrement.key_for(request).get(use_cache=False)
            # stored as a put() of the model would store it: its call, fingerprint and answer, and its expiry for the
            # TTL policy and the sweep
            assert stored.call == "mine" and stored.expires == marker.expires
            assert (stored.fingerprint, stored.answer) == (request.fingerprint, {"attempts": 1, "shard": 0})
            assert isinstance(stored.expires, datetime.datetime)


def test_an_increment_the_backend_drops_is_an_error_never_a_count(legacy_stack):
    with running(_app(legacy_stack)):
        assert runtime.current().datastore.increments is None  # the app never sends them to legacy
        # as if misconfigured: the app's own Datastore API client, sending increments to legacy
        increments = ServerIncrements(runtime.current().settings, runtime.current().datastore.aggregations.api)
        with runtime.current().context(), pytest.raises(RuntimeError, match="did not apply a server-side increment"):
            increments.commit(ndb.Key(CounterShard, "dropped|0"), "count")


def test_a_mapper_chunks_increment_the_backend_drops_fails_the_chunk(legacy_stack):
    """The same check on a transaction's commit (core/datastore.transforms_applied): a mapper chunk whose increments
    were dropped fails loudly. Its commit (the task's record with it) has landed; the delivery's error says so, where
    it would otherwise report the chunk done."""
    with running(_app(legacy_stack)), runtime.current().context():
        key = ndb.Key(CounterShard, "dropped|1")
        CounterShard(key=key, count=1).put()
        store = increments.IncrementStore("CounterShard", blind=True)  # as if misconfigured: increments sent to legacy
        with pytest.raises(RuntimeError, match="did not apply a server-side increment"):
            store.transact(lambda: store.put_multi([increments.incremented(e, {"count": 1})
                                                    for e in store.get_multi([key])]))


class GroupProbe(ndb.Model):
    n = ndb.IntegerProperty()


def _groups_in_one_transaction(count):
    """Write `count` root entities (each its own entity group) in one transaction."""
    keys = [ndb.Key(GroupProbe, f"g{i}") for i in range(count)]
    ndb.transaction(lambda: ndb.put_multi([GroupProbe(key=k, n=1) for k in keys]), retries=0)
    return len([e for e in ndb.get_multi(keys, use_cache=False) if e is not None])


def test_the_25_group_limit_is_the_legacy_emulators_only(legacy_stack, firestore_stack):
    """Why the mapper's chunks and the seed transactions stop at 25 entity groups: Datastore before Firestore (the
    legacy emulator) refuses a 26th; Firestore in Datastore mode does not."""
    with running(_app(legacy_stack)), runtime.current().context():
        assert _groups_in_one_transaction(25) == 25
        with pytest.raises(core_exceptions.InvalidArgument, match="entity groups"):
            _groups_in_one_transaction(26)
    with running(_app(firestore_stack)), runtime.current().context():
        assert _groups_in_one_transaction(60) == 60


def test_aggregation_queries_are_firestores_only(legacy_stack, firestore_stack):
    """COUNT and SUM over a kind: Firestore in Datastore mode answers them (by reading every index entry); the legacy
    emulator has none."""
    with running(_app(firestore_stack)), runtime.current().context():
        ndb.put_multi([ndb.Expando(key=ndb.Key("Account", i + 1), balance=i) for i in range(30)])
        assert runtime.current().datastore.aggregations.count_and_sum("Account", "balance") == (30, 435)
    with running(_app(legacy_stack)), pytest.raises(core_exceptions.MethodNotImplemented):
        runtime.current().datastore.aggregations.count_and_sum("Account", "balance")


def test_a_ranges_keys_through_the_api_are_ndbs_keys_in_order_across_batches(legacy_stack, firestore_stack):
    """core/datastore.Bulk.keys, the mapper's listing: the keys of (after, upto] in key order, ndb's own keys, as
    ndb's keys-only query answers them; all of them though the legacy emulator answers 300 a batch, and at most
    `limit`; nothing of another kind or below the bound."""
    for stack in (legacy_stack, firestore_stack):
        with running(_app(stack)), runtime.current().context():
            keys = ndb.put_multi([GroupProbe(n=i) for i in range(700)])
            ndb.put_multi([ndb.Expando(key=ndb.Key("OtherKind", i + 1)) for i in range(5)])
            ordered = GroupProbe.query().order(GroupProbe.key).fetch(keys_only=True)
            bulk = runtime.current().datastore.bulk
            assert bulk.keys("GroupProbe", None, ordered[-1]) == ordered == sorted(keys, key=lambda k: k.id())
            assert bulk.keys("GroupProbe", ordered[9], ordered[650]) == ordered[10:651]
            assert bulk.keys("GroupProbe", ordered[9], ordered[650], limit=501) == ordered[10:511]
            assert bulk.keys("GroupProbe", ordered[-1], ordered[-1]) == []
