"""What production would bill (core/billing.py), counted from each RPC's own answer on the real emulator, against
figures worked out by hand from Firestore in Datastore mode's pricing rules: a Lookup of found and missing keys, a
query with an offset, a keys-only query, an aggregation, a commit that writes and deletes. On both backends (CI runs
the suite on each): the counts come from the answers, and both emulators answer them alike."""
import re

import pytest
from google.api_core import exceptions
from google.cloud import ndb

from core import billing, costs, runtime
from tests.support import Auth, billed, make_app, running


class Billable(ndb.Model):
    n = ndb.IntegerProperty()


def _uncached():
    return {"use_cache": False, "use_global_cache": False}


@pytest.fixture
def kind_of_30(ndb_context):
    """30 entities n = 0..29, written in one batch."""
    return ndb.put_multi([Billable(id=f"b{i:02}", n=i) for i in range(30)], **_uncached())


def test_a_lookup_bills_a_read_for_each_key_found_or_missing(kind_of_30):
    keys = kind_of_30[:3] + [ndb.Key(Billable, "absent-1"), ndb.Key(Billable, "absent-2")]
    with costs.measured() as cost:
        got = ndb.get_multi(keys, **_uncached())
    assert [g is not None for g in got] == [True, True, True, False, False]
    assert cost.datastore == {"Lookup": 1}
    assert cost.billed == billing.Billed(reads=5)
    assert cost.billed_from == {"found": 3, "missing": 2}


def test_an_offset_bills_every_skipped_entity_as_a_read(kind_of_30):
    """The offset lesson in production's terms: 20 skipped + 5 returned = 25 reads for 5 entities shown, on both
    backends, although the Firestore emulator skips them at no visible cost in time."""
    with costs.measured() as cost:
        page = Billable.query().order(Billable.n).fetch(5, offset=20, **_uncached())
    assert [e.n for e in page] == [20, 21, 22, 23, 24]
    assert cost.billed == billing.Billed(reads=25)
    assert cost.billed_from == {"entities": 5, "skipped": 20}


def test_a_keys_only_query_bills_one_read_for_the_query_and_its_keys_as_free_small_operations(kind_of_30):
    with costs.measured() as cost:
        keys = Billable.query().order(Billable.n).fetch(10, keys_only=True, **_uncached())
    assert len(keys) == 10 and cost.datastore == {"RunQuery": 1}
    assert cost.billed == billing.Billed(reads=1, small=10)
    assert cost.billed.usd_per_million() == pytest.approx(0.3)  # one read: $0.03 per 100,000


def test_a_query_that_finds_nothing_bills_nothing_as_datastore_mode_does(kind_of_30):
    """Datastore mode's minimum for a query of at most one range property is zero reads (Native mode's is one): an
    empty answer bills nothing; keys-only, still the read for the query itself."""
    with costs.measured() as cost:
        assert Billable.query(Billable.n > 1000).fetch(**_uncached()) == []
    assert cost.datastore == {"RunQuery": 1} and cost.billed == billing.Billed()
    with costs.measured() as cost:
        assert Billable.query(Billable.n > 1000).fetch(keys_only=True, **_uncached()) == []
    assert cost.billed == billing.Billed(reads=1)


def test_a_commit_bills_each_entity_written_and_each_deleted(kind_of_30):
    @ndb.transactional()
    def change():
        ndb.put_multi([Billable(id="new-1", n=100), Billable(id="new-2", n=101)], **_uncached())
        kind_of_30[0].delete(**_uncached())

    with costs.measured() as cost:
        change()
    assert cost.datastore["Commit"] == 1
    assert cost.billed == billing.Billed(writes=2, deletes=1)
    assert cost.billed_from == {"written": 2, "deleted": 1}
    assert cost.billed.usd_per_million() == pytest.approx(2 * 0.9 + 0.1)
    assert ndb.Key(Billable, "new-2").get(**_uncached()).n == 101 and kind_of_30[0].get(**_uncached()) is None


def test_an_aggregation_bills_a_read_per_thousand_index_entries_and_a_failed_rpc_bills_nothing(ndb_context,
                                                                                                 backend):
    """1,500 accounts counted and summed: 1,500 index entries, two reads. The legacy emulator has no aggregation
    queries: its refused RPC is counted as an RPC and billed nothing."""
    ndb.put_multi([Billable(id=f"a{i:04}", n=1) for i in range(1500)], **_uncached())
    aggregations = runtime.current().datastore.aggregations
    with costs.measured() as cost:
        if backend == "legacy":
            with pytest.raises(exceptions.MethodNotImplemented):
                aggregations.count_and_sum("Billable", "n")
        else:
            assert aggregations.count_and_sum("Billable", "n") == (1500, 1500)
    assert cost.datastore == {"RunAggregationQuery": 1}
    if backend == "legacy":
        assert cost.billed == billing.Billed() and not cost.billed_from
    else:
        assert cost.billed == billing.Billed(reads=2)
        assert cost.billed_from == {"index entries": 1500}


@pytest.mark.parametrize("entries, reads", [(0, 1), (1, 1), (999, 1), (1000, 1), (1001, 2), (2500, 3), (3000, 3)])
def test_an_aggregation_bills_each_batch_of_a_thousand_index_entries_begun(entries, reads):
    """A read per batch of up to 1,000 index entries: a partial batch is a read, and counting none still reads once.
    From a RunAggregationQuery request and answer built as the app sends and gets them (COUNT beside SUM, as
    core.datastore.Aggregations asks), at the counts where rounding shows: on both backends, as the legacy emulator
    has no aggregations to answer."""
    from google.cloud import datastore_v1 as v1

    aggregation = v1.AggregationQuery.Aggregation
    request = v1.RunAggregationQueryRequest(aggregation_query=v1.AggregationQuery(
        nested_query=v1.Query(kind=[v1.KindExpression(name="Billable")]),
        aggregations=[aggregation(alias="n", count=aggregation.Count()),
                      aggregation(alias="total", sum=aggregation.Sum(property=v1.PropertyReference(name="n")))]))
    answer = v1.RunAggregationQueryResponse(batch=v1.AggregationResultBatch(aggregation_results=[
        v1.AggregationResult(aggregate_properties={"n": v1.Value(integer_value=entries),
                                                   "total": v1.Value(integer_value=3 * entries)})]))
    assert billing.of("RunAggregationQuery", request, answer) == (billing.Billed(reads=reads),
                                                                  {"index entries": entries})


def test_an_aggregation_through_the_app_bills_one_read_more_at_the_thousand_and_first_account(firestore_stack):
    """The bill in the Server-Timing header of the admins' COUNT and SUM over the accounts, at 1,000 accounts and at
    1,001: the same request, one more read. On a Firestore emulator whatever the suite's backend: the legacy emulator
    has no aggregation queries."""
    from accounts.models import Account

    with running(make_app(firestore_stack, **firestore_stack.fresh())) as app:
        client = app.test_client()
        Auth(client).admin()
        bills = []
        for first, count in ((0, 1000), (1000, 1)):
            with runtime.current().context():
                ndb.put_multi([Account(id=first + i + 1, balance=1) for i in range(count)])
            r = client.post("/api/accounts/aggregation")
            assert r.status_code == 200 and r.get_json()["aggregation"]["count"] == first + count
            bills.append(billed(r)[0])
    assert bills[1] == bills[0] + 1, bills


def test_the_rules_on_hand_made_answers():
    """The rules themselves, where the emulators cannot show them: a projection with DISTINCT ON is billed as
    entities, an aggregation without COUNT is billed its minimum read, allocating ids is free."""
    from google.cloud import datastore_v1 as v1

    distinct = v1.RunQueryRequest(query=v1.Query(distinct_on=[v1.PropertyReference(name="n")]))
    answer = v1.RunQueryResponse(batch=v1.QueryResultBatch(entity_result_type=2, skipped_results=3,
                                                           entity_results=[v1.EntityResult()] * 4))
    assert billing.of("RunQuery", distinct, answer)[0] == billing.Billed(reads=7)
    assert billing.of("RunQuery", v1.RunQueryRequest(query=v1.Query()), answer)[0] == billing.Billed(reads=4, small=4)
    sum_only = v1.RunAggregationQueryRequest(aggregation_query=v1.AggregationQuery(aggregations=[
        v1.AggregationQuery.Aggregation(alias="s", sum=v1.AggregationQuery.Aggregation.Sum())]))
    assert billing.of("RunAggregationQuery", sum_only, v1.RunAggregationQueryResponse())[0] == billing.Billed(reads=1)
    assert billing.of("AllocateIds", v1.AllocateIdsRequest(keys=[v1.Key()] * 3),
                      v1.AllocateIdsResponse())[0] == billing.Billed(small=3)
    assert billing.of("BeginTransaction", v1.BeginTransactionRequest(),
                      v1.BeginTransactionResponse())[0] == billing.Billed()


def test_every_answer_says_what_production_would_bill_it(client, auth):
    """The header, the footer, the admins' page and API, for a request that reads and one that reads nothing."""
    auth.sign_in()
    assert client.post("/api/counters/billed/increment").status_code == 200
    wrote = billed(client.post("/api/counters/billed/increment"))
    assert wrote[1] >= 1 and wrote[3] > 0
    first = client.get("/api/counters/billed?cache=bypass")
    reads = billed(first)[0]
    assert reads >= 1 and billed(first)[3] == pytest.approx(reads * 0.3)
    page = client.get("/counters").get_data(as_text=True)
    assert re.search(r"billed in production: (nothing in Datastore|\d+ reads?[^<]*per million such requests)", page)
    session = client.get("/api/session")
    assert billed(session) == (0, 0, 0, 0.0)
    auth.admin()
    recent = client.get("/api/appstats").get_json()["requests"]
    mine = next(r for r in recent if r["path"] == "/api/counters/billed?cache=bypass")
    assert mine["billed"]["reads"] == reads and mine["billed"]["usd_per_million"] == pytest.approx(reads * 0.3)
    html = client.get("/appstats").get_data(as_text=True)
    assert "Billed in production" in html and f"{reads} reads," in html
