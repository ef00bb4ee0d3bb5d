"""The ndb client (one per process) and the ndb context each request and worker thread runs in."""
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.auth.credentials import AnonymousCredentials
from google.cloud import datastore_v1, ndb
from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcTransport
from google.cloud.ndb import model as ndb_model

from core import billing, costs, production_latency
from core.production_latency import Model
from core.settings import Settings

log = logging.getLogger(__name__)


class RpcCounter(grpc.UnaryUnaryClientInterceptor):
    """Every unary Datastore RPC, counted for the request that sent it (found when the call is made, on its thread: the
    answer may arrive on a gRPC thread). Under a latency `model` the stand-in waits production's round trip and says
    how long in its answer; that wait is kept apart, so production's wait and this machine's time show apart."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self._unmodelled_said = False

    def intercept_unary_unary(self, continuation: Callable, client_call_details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        cost = costs.current()
        started = time.perf_counter()
        method = client_call_details.method
        method = (method if isinstance(method, str) else method.decode()).rsplit("/", 1)[-1]
        self.model.names_the_request()
        outcome = continuation(client_call_details, request)
        if cost is not None:
            def done(answered: grpc.Future) -> None:
                waited = self.stand_in_wait(answered)  # kept with the call: its timeline shows the two apart
                if answered.exception() is None:
                    cost.add_rpc(method, started, *billing.of(method, request, answered.result()), waited=waited)
                else:  # a failed RPC is not billed its reads or writes
                    cost.add_rpc(method, started, waited=waited)
            outcome.add_done_callback(done)
        return outcome

    def stand_in_wait(self, answered: grpc.Future) -> float:
        """The seconds the stand-in waited for this RPC, from its answer's trailing metadata (0 without one)."""
        trailers = dict(getattr(answered, "trailing_metadata", lambda: None)() or ())
        if production_latency.WAIT_HEADER in trailers:
            return float(trailers[production_latency.WAIT_HEADER]) / 1000
        if self.model.on and not self._unmodelled_said and answered.exception() is None:
            self._unmodelled_said = True
            log.warning("LATENCY=%s, but the Datastore answered without the stand-in's wait: reach it through the "
                        "address devstack gives (DATASTORE_EMULATOR_HOST), or nothing waits production's round trips",
                        self.model.name)
        return 0.0


def make_client(settings: Settings, model: Model) -> ndb.Client:
    """Built once per process: it holds the gRPC channel every request reuses, every RPC on it (all made through
    `client.stub`) counted."""
    if not settings.emulator_host:
        client = ndb.Client(project=settings.project, namespace=settings.namespace)
        channel = client.stub.grpc_channel
    else:
        # ndb.Client reads the emulator's address only from the process environment, which the settings need not match
        # (tests run two emulators, and build apps on threads). So the client is built with no need of credentials (the
        # emulator asks for none), then given a channel of its own to the settings' emulator; os.environ is not touched.
        client = ndb.Client(project=settings.project, namespace=settings.namespace, credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": settings.emulator_host})
        client.host, client.secure = settings.emulator_host, False
        channel = grpc.insecure_channel(settings.emulator_host, options=[  # ndb's own, for an emulator's channel
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
    client.stub = DatastoreGrpcTransport(host=client.host, channel=grpc.intercept_channel(channel, RpcCounter(model)))
    return client


def make_api(settings: Settings, model: Model) -> datastore_v1.DatastoreClient:
    """A client of the Datastore API itself: one per process, its RPCs counted like ndb's."""
    channel = (grpc.insecure_channel(settings.emulator_host) if settings.emulator_host
               else DatastoreGrpcTransport.create_channel())
    return datastore_v1.DatastoreClient(
        transport=DatastoreGrpcTransport(channel=grpc.intercept_channel(channel, RpcCounter(model))))


# The protobuf classes under proto-plus's wrappers, which cost a bulk path more client CPU than the protobufs do.
EntityPb = datastore_v1.Entity.pb()
KeyPb = datastore_v1.Key.pb()
MutationPb = datastore_v1.Mutation.pb()


class DatastoreApi:
    """The Datastore API beside ndb, for what ndb does not offer; `api` is the process's client (make_api)."""

    def __init__(self, settings: Settings, api: datastore_v1.DatastoreClient) -> None:
        self.project = settings.project
        self.namespace = settings.namespace or ""
        self.api = api

    def key_pb(self, key: ndb.Key) -> Any:
        path = [KeyPb.PathElement(kind=kind, **({"id": ident} if isinstance(ident, int) else {"name": ident}))
                for kind, ident in key.pairs()]
        return KeyPb(partition_id=datastore_v1.PartitionId.pb()(project_id=self.project,
                                                               namespace_id=key.namespace() or ""), path=path)


class Bulk(DatastoreApi):
    """The Datastore API itself, as protobufs, for bulk work whose client CPU through ndb is the bottleneck."""

    def keys(self, kind: str, after: ndb.Key | None, upto: ndb.Key | None, limit: int | None = None) -> list[ndb.Key]:
        """The keys of `kind` in (after, upto] (None: no bound), in key order, at most `limit` (None: all): a
        keys-only query, asked again from its cursor while the datastore answers part (the legacy emulator answers
        300 keys a batch)."""
        query = datastore_v1.Query.pb()(kind=[{"name": kind}], projection=[{"property": {"name": "__key__"}}],
                                        order=[{"property": {"name": "__key__"}}])
        operator = datastore_v1.PropertyFilter.Operator
        for op, key in [(operator.GREATER_THAN, after), (operator.LESS_THAN_OR_EQUAL, upto)]:
            if key is not None:
                query.filter.composite_filter.op = datastore_v1.CompositeFilter.Operator.AND
                query.filter.composite_filter.filters.add(property_filter={
                    "property": {"name": "__key__"}, "op": op, "value": {"key_value": self.key_pb(key)}})
        found: list[ndb.Key] = []
        while limit is None or len(found) < limit:
            if limit is not None:
                query.limit.value = limit - len(found)
            request = datastore_v1.RunQueryRequest.pb()(
                project_id=self.project, partition_id={"project_id": self.project, "namespace_id": self.namespace},
                query=query)
            batch = datastore_v1.RunQueryResponse.pb(self.api.run_query(
                request=datastore_v1.RunQueryRequest.wrap(request), timeout=60)).batch
            found += [ndb.Key(*[part for e in result.entity.key.path for part in (e.kind, e.id or e.name)],
                              namespace=self.namespace or None) for result in batch.entity_results]
            if batch.more_results != datastore_v1.QueryResultBatch.MoreResultsType.NOT_FINISHED:
                break
            query.start_cursor = batch.end_cursor
        return found

    def run(self, fn: Callable[["Transaction"], Any]) -> Any:
        """fn(transaction), which commits it or writes nothing; rolled back unless it committed (raising, or
        returning with nothing to write): on Firestore what a transaction read stays locked until it ends."""
        begun = Transaction(self, self.api.begin_transaction(project_id=self.project, timeout=30).transaction)
        try:
            return fn(begun)
        finally:
            if not begun.committed:
                with contextlib.suppress(Exception):  # at worst the transaction times out on its own
                    self.api.rollback(project_id=self.project, transaction=begun.id, timeout=30)


class Transaction:
    def __init__(self, bulk: Bulk, transaction_id: bytes) -> None:
        self.bulk, self.id, self.committed = bulk, transaction_id, False

    def lookup(self, keys: list[ndb.Key]) -> list[Any]:
        """Each key's entity as this transaction reads it (an EntityPb), or None where there is none; in the keys'
        order. A Lookup may answer part of its keys and defer the rest: they are asked again."""
        api = self.bulk
        wanted = [api.key_pb(key) for key in keys]
        found: dict[tuple, Any] = {}
        pending = wanted
        while pending:
            request = datastore_v1.LookupRequest.pb()(project_id=api.project, keys=pending,
                                                      read_options={"transaction": self.id})
            answer = datastore_v1.LookupResponse.pb(api.api.lookup(
                request=datastore_v1.LookupRequest.wrap(request), timeout=30))
            found.update((_path(result.entity.key), result.entity) for result in answer.found)
            pending = list(answer.deferred)
        return [found.get(_path(key)) for key in wanted]

    def commit(self, mutations: list[Any]) -> Any:
        """Commit the transaction with `mutations`; the CommitResponse, its transforms checked applied."""
        api = self.bulk
        request = datastore_v1.CommitRequest.pb()(project_id=api.project, transaction=self.id, mutations=mutations,
                                                  mode=datastore_v1.CommitRequest.Mode.TRANSACTIONAL)
        answer = api.api.commit(request=datastore_v1.CommitRequest.wrap(request), timeout=30)
        self.committed = True
        return transforms_applied(mutations, datastore_v1.CommitResponse.pb(answer))


def transforms_applied(mutations: list[Any], answer: Any) -> Any:
    """A commit's `answer` once it shows a result for every transform of its `mutations`, else RuntimeError: the legacy
    emulator silently drops them, and an increment never applied must not be reported done."""
    for mutation, result in zip(mutations, answer.mutation_results, strict=True):
        if len(result.transform_results) != len(mutation.property_transforms):
            raise RuntimeError("The datastore did not apply a server-side increment (the legacy Datastore emulator "
                               "drops them): they are sent only where the backend applies them (Firestore in "
                               "Datastore mode, DATASTORE_BACKEND=firestore).")
    return answer


def entity_pb(model: ndb.Model) -> Any:
    """An ndb entity as the Datastore API's protobuf, serialized by ndb itself, as its put() would store it."""
    model._prepare_for_put()
    return datastore_v1.Entity.pb(ndb_model._entity_to_protobuf(model))


def _path(key: Any) -> tuple:
    return tuple((element.kind, element.id, element.name) for element in key.path)


class Aggregations(DatastoreApi):
    """COUNT and SUM aggregation queries, which ndb does not offer. Firestore in Datastore mode reads every index entry
    of the kind (time grows with N; billed one read per 1,000 entries); the legacy emulator answers 501 UNIMPLEMENTED.
    """

    def count_and_sum(self, kind: str, prop: str) -> tuple[int, int]:
        """(entities of `kind`, the sum of their `prop`) in the app's namespace; MethodNotImplemented on legacy."""
        aggregation = datastore_v1.AggregationQuery.Aggregation
        request = datastore_v1.RunAggregationQueryRequest(
            project_id=self.project,
            partition_id=datastore_v1.PartitionId(project_id=self.project, namespace_id=self.namespace),
            aggregation_query=datastore_v1.AggregationQuery(
                nested_query=datastore_v1.Query(kind=[datastore_v1.KindExpression(name=kind)]),
                aggregations=[aggregation(alias="n", count=aggregation.Count()),
                              aggregation(alias="total", sum=aggregation.Sum(
                                  property=datastore_v1.PropertyReference(name=prop)))]))
        row = self.api.run_aggregation_query(request=request, timeout=120).batch.aggregation_results[0]
        values = row.aggregate_properties
        total = values["total"]
        return values["n"].integer_value, int(total.integer_value or total.double_value)


class ServerIncrements(DatastoreApi):
    """Server-side increments (`PropertyTransform.increment`) in one non-transactional commit: Firestore in Datastore
    mode only. A blind increment takes no lock, so it keeps committing where a read-modify-write transaction on a busy
    entity times out on Firestore's lock (bench/results/counters.md); an insert beside it (an idempotency marker)
    makes it happen at most once. The legacy emulator silently drops the increment (and the masked upsert wipes the
    entity's other properties): it is never sent there, and every commit is checked for the transform's result."""

    def commit(self, key: ndb.Key, field: str, delta: int = 1, insert: ndb.Model | None = None) -> int:
        """Add `delta` to `field` of entity `key` (created when missing) and insert `insert` in the same commit; the
        field's new value. AlreadyExists when `insert`'s entity exists already (then nothing was written)."""
        mutations = []
        if insert is not None:
            mutations.append(datastore_v1.Mutation(insert=entity_pb(insert)))
        mutations.append(datastore_v1.Mutation(
            upsert=datastore_v1.Entity(key=self.key_pb(key)),
            # An upsert that changes no property but the transformed one.
            property_mask=datastore_v1.PropertyMask(paths=[]),
            property_transforms=[datastore_v1.PropertyTransform(property=field,
                                                                increment=datastore_v1.Value(integer_value=delta))]))
        response = transforms_applied(mutations, self.api.commit(request=datastore_v1.CommitRequest(
            project_id=self.project, mode=datastore_v1.CommitRequest.Mode.NON_TRANSACTIONAL, mutations=mutations),
            timeout=10))
        return response.mutation_results[-1].transform_results[0].integer_value


class Datastore:
    """The process's ndb client, the global cache every context uses, and the Datastore API beside it."""

    def __init__(self, client: ndb.Client, aggregations: Aggregations, bulk: Bulk,
                 global_cache: ndb.GlobalCache | None = None, increments: ServerIncrements | None = None) -> None:
        self.client = client
        self.bulk = bulk  # the Datastore API itself, for bulk work (a mapper job's listings and chunks)
        self.global_cache = global_cache
        self.increments = increments  # ServerIncrements where the backend applies them, else None
        self.aggregations = aggregations  # COUNT and SUM queries (the backend may refuse them)

    def context(self) -> contextlib.AbstractContextManager[ndb.Context]:
        """A fresh ndb context: one per request, one per worker thread (contexts do not nest)."""
        return self.client.context(global_cache=self.global_cache)
