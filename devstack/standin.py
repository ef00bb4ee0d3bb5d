"""The stand-in for production's Datastore: one gRPC proxy in front of the emulator (legacy Datastore, or Firestore in
Datastore mode), started by devstack whenever LATENCY names a profile. Every client reaches it through the emulator
address devstack gives them (DATASTORE_EMULATOR_HOST): the app's processes, the benchmarks, Beam's pipeline. So what
production does to one client because of the others happens here too, which no wait inside each client can do.

What it does to each Datastore v1 RPC (every figure is core/production_latency.py's, cited there):
- It waits the RPC's round trip, drawn from the profile's figures and grown with its size (a Lookup's keys, a
  Commit's mutations), less the emulator's own time for it: max(0, round trip - emulator), half before forwarding it
  and half after, so a transaction's window on the server stays production's. The emulator's time is known only once
  it has answered, so the first half assumes the time it took for this method lately (`_Forwarder.expected`).
- Calls in flight together wait together: each call is a task of its own, and nothing serialises unrelated calls.
- A Commit that writes an entity (Firestore in Datastore mode: the entity; legacy: its entity group, the root key)
  takes its turn at it among every client's commits, holding it for its whole modelled commit, and above the
  sustained rate (ENTITY_WRITES_PER_S, ENTITY_WRITE_BURST) waits until the entity takes writes again. A commit whose
  turn cannot come within ENTITY_TURN_MAX_WAIT_S is answered ABORTED "Too much contention on these datastore
  entities. Please try again.", as production answers, and its transaction is rolled back on the emulator.
- It reports what it waited in the answer's trailing metadata (`x-standin-wait-ms`, and the profile under
  `x-standin-profile`): the app shows production's wait and this machine's time apart (core/datastore.py).

Only gRPC goes through it. The legacy emulator's HTTP endpoints (/reset, /shutdown, its health page) are reached at
the emulator's own address, which devstack keeps (devstack/services.py).

Run by devstack as `python -m devstack.standin --target HOST:PORT --port N --profile production --backend legacy`.
"""
import argparse
import asyncio
import collections
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
from google.cloud import datastore_v1

from core import billing, production_latency
from core.production_latency import Model

SERVICE = "/google.datastore.v1.Datastore/"
_UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
# Metadata that belongs to the connection, not to the call: not forwarded.
_OWN_HEADERS = ("user-agent", "content-type", "te", "grpc-")


class Contended(Exception):
    """A commit's turn at an entity would not come within the bound: production answers ABORTED."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(waited_s)
        self.waited_s = waited_s  # how long it waited before that was known


class _Entity:
    """One entity's (or entity group's) writes: whose turn it is, and a bucket of ENTITY_WRITE_BURST writes that
    refills at ENTITY_WRITES_PER_S."""

    def __init__(self, now: float) -> None:
        self.turn = asyncio.Lock()  # asyncio's waiters are woken in the order they came: first come, first served
        self.writes, self.at = float(production_latency.ENTITY_WRITE_BURST), now

    def _refill(self, now: float) -> None:
        burst, rate = production_latency.ENTITY_WRITE_BURST, production_latency.ENTITY_WRITES_PER_S
        self.writes, self.at = min(float(burst), self.writes + (now - self.at) * rate), now

    def next_write_at(self, now: float) -> float:
        self._refill(now)
        return now if self.writes >= 1 else now + (1 - self.writes) / production_latency.ENTITY_WRITES_PER_S

    def write(self, now: float) -> None:
        self._refill(now)
        self.writes -= 1

    def idle(self, now: float) -> bool:
        """Nobody holds or waits for it and its bucket is full: forgetting it changes nothing."""
        self._refill(now)
        return not self.turn.locked() and self.writes >= production_latency.ENTITY_WRITE_BURST


class Turns:
    """Every entity's writes, across every client: a commit holds each entity it writes for its whole modelled commit,
    and an entity takes ENTITY_WRITES_PER_S writes a second after a burst of ENTITY_WRITE_BURST."""

    def __init__(self) -> None:
        self._entities: dict[tuple, _Entity] = {}

    @contextlib.asynccontextmanager
    async def held(self, keys: Iterable[tuple]) -> AsyncIterator[float]:
        """The block runs holding every entity of `keys`, once each can take a write; yields the seconds waited for
        them. Contended when that would take longer than ENTITY_TURN_MAX_WAIT_S."""
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        deadline = arrived + production_latency.ENTITY_TURN_MAX_WAIT_S
        held: list[_Entity] = []
        try:
            for key in sorted(set(keys)):  # one order for every commit: two commits never hold what each waits for
                entity = self._entities.setdefault(key, _Entity(arrived))
                try:
                    async with asyncio.timeout(max(deadline - loop.time(), 0)):
                        await entity.turn.acquire()
                except TimeoutError:
                    raise Contended(loop.time() - arrived) from None
                held.append(entity)
            ready = max((entity.next_write_at(loop.time()) for entity in held), default=loop.time())
            if ready > deadline:
                raise Contended(loop.time() - arrived)  # answered now: waiting would not bring its turn in time
            await asyncio.sleep(ready - loop.time())
            for entity in held:
                entity.write(loop.time())
            yield loop.time() - arrived
        finally:
            for entity in held:
                entity.turn.release()
            if len(self._entities) > 10_000:  # a bulk load writes many entities once: forget the idle ones
                now = loop.time()
                self._entities = {k: e for k, e in self._entities.items() if not e.idle(now)}


def written(commit: Any, backend: str) -> list[tuple]:
    """What a Commit (a CommitRequest protobuf) writes, as the units production bounds: on Firestore each entity, on
    legacy Datastore each entity group (its root key). A new entity without an id yet contends with nobody."""
    units = []
    for mutation in commit.mutations:
        operation = mutation.WhichOneof("operation")
        if operation is None:
            continue
        key = mutation.delete if operation == "delete" else getattr(mutation, operation).key
        path = [(e.kind, getattr(e, e.WhichOneof("id_type") or "id")) for e in key.path]
        if backend == "legacy":
            path = path[:1]
        if path and path[-1][1]:
            partition = key.partition_id
            units.append((partition.project_id, partition.database_id, partition.namespace_id, tuple(path)))
    return units


class _Forwarder:
    """The proxy itself: each RPC waited as production's and forwarded to the emulator as bytes."""

    def __init__(self, target: str, profile: str, backend: str, seed: int | None) -> None:
        self.model = Model(profile, seed)
        self.backend = backend
        self.channel = grpc.aio.insecure_channel(target, options=_UNLIMITED)
        self.turns = Turns()
        # The transactions it aborted (rolled back on the emulator already), the latest 10,000: a client's own
        # Rollback of one after its ABORTED (python-ndb sends one) is answered here, as production answers it, where
        # the emulator would say the transaction is no more.
        self._aborted: collections.deque[bytes] = collections.deque(maxlen=10_000)
        self._emulator_s: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=16))

    def expected(self, method: str) -> float:
        """The emulator's time for `method` lately (the median of its last 16): what the first half assumes."""
        times = self._emulator_s[method]
        return statistics.median(times) if times else 0.0

    async def answer(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        keys = mutations = 1
        commit, units, forward = None, [], True
        if method == "Lookup":
            keys = len(datastore_v1.LookupRequest.pb().FromString(request).keys)
        elif method == "Rollback":
            forward = datastore_v1.RollbackRequest.pb().FromString(request).transaction not in self._aborted
        elif method == "Commit":
            commit = datastore_v1.CommitRequest.pb().FromString(request)
            mutations, units = len(commit.mutations), written(commit, self.backend)
        trip = self.model.datastore_round_trip(method, keys=keys, mutations=mutations)
        try:
            async with self.turns.held(units) as turn_s:
                return await self._round_trip(method, request, context, trip, turn_s, forward)
        except Contended as contended:
            if commit is not None and commit.transaction:  # production's abort frees the transaction's locks
                self._aborted.append(commit.transaction)
                await self._rollback(commit)
            await context.abort(grpc.StatusCode.ABORTED, production_latency.CONTENTION,
                                trailing_metadata=self._reported(contended.waited_s * 1000))
            raise  # not reached: abort() raises

    async def _round_trip(self, method: str, request: bytes, context: grpc.aio.ServicerContext, trip: float,
                          turn_s: float, forward: bool) -> bytes:
        """The RPC forwarded (or, not `forward`, answered here: an empty RollbackResponse) between its two halves."""
        before = max(trip - self.expected(method), 0.0) / 2
        await asyncio.sleep(before)
        started = time.perf_counter()
        answer: bytes | None = b""
        if forward:
            try:
                answer = await self.channel.unary_unary(SERVICE + method)(
                    request, metadata=self._forwarded(context), timeout=context.time_remaining())
            except grpc.aio.AioRpcError as error:
                answer, failure = None, error
        emulator_s = time.perf_counter() - started
        if forward:
            self._emulator_s[method].append(emulator_s)
        if method == "RunAggregationQuery" and answer is not None:  # the scan's share grows with what it counted
            response = datastore_v1.RunAggregationQueryResponse.pb().FromString(answer)
            query = datastore_v1.RunAggregationQueryRequest.pb().FromString(request)
            trip += self.model.scan(billing.of(method, query, response)[1].get("index entries", 0))
        after = max(trip - emulator_s - before, 0.0)
        await asyncio.sleep(after)
        reported = self._reported((turn_s + before + after) * 1000)
        if answer is None:  # the emulator's error, as it gave it, after the same waits
            await context.abort(failure.code(), failure.details() or "", trailing_metadata=reported)
            raise failure  # not reached: abort() raises
        context.set_trailing_metadata(reported)
        return answer

    def _reported(self, waited_ms: float) -> tuple[tuple[str, str], ...]:
        return ((production_latency.WAIT_HEADER, f"{waited_ms:.3f}"),
                (production_latency.PROFILE_HEADER, self.model.name))

    @staticmethod
    def _forwarded(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:
        return tuple((k, v) for k, v in context.invocation_metadata() or ()
                     if not k.startswith(":") and not k.startswith(_OWN_HEADERS))

    async def _rollback(self, commit: Any) -> None:
        request = datastore_v1.RollbackRequest.pb()(project_id=commit.project_id, database_id=commit.database_id,
                                                    transaction=commit.transaction)
        with contextlib.suppress(grpc.aio.AioRpcError):  # at worst the emulator times the transaction out itself
            await self.channel.unary_unary(SERVICE + "Rollback")(request.SerializeToString(), timeout=10)


class _Handler(grpc.GenericRpcHandler):
    """Every unary method of google.datastore.v1.Datastore, forwarded as bytes (nothing parsed but what must be)."""

    def __init__(self, forwarder: _Forwarder) -> None:
        self.forwarder = forwarder

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = handler_call_details.method
        if not path.startswith(SERVICE):
            return None
        method = path[len(SERVICE):]

        async def answer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await self.forwarder.answer(method, request, context)
        return grpc.unary_unary_rpc_method_handler(answer)


async def serve(target: str, port: int, profile: str, backend: str, seed: int | None) -> None:
    server = grpc.aio.server(options=_UNLIMITED)
    server.add_generic_rpc_handlers((_Handler(_Forwarder(target, profile, backend, seed)),))
    try:
        server.add_insecure_port(f"127.0.0.1:{port}")
    except RuntimeError as error:  # grpc says only that it failed to bind: devstack retries on another port
        raise SystemExit(f"stand-in: Address already in use? port {port}: {error}") from None
    await server.start()
    print(f"stand-in: {profile} on {backend}, 127.0.0.1:{port} -> {target}", flush=True)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack.standin", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the emulator's host:port")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--profile", choices=production_latency.PROFILES, required=True)
    parser.add_argument("--backend", choices=("legacy", "firestore"), required=True)
    parser.add_argument("--seed", type=int, default=None, help="LATENCY_SEED: the same draws run after run")
    parser.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                        help=f"another value for one of {', '.join(production_latency.KNOBS)}")
    args = parser.parse_args(argv)
    for assignment in args.set:
        name, _, value = assignment.partition("=")
        if name not in production_latency.KNOBS:
            parser.error(f"--set {name}: not one of {', '.join(production_latency.KNOBS)}")
        setattr(production_latency, name, float(value))
    asyncio.run(serve(args.target, args.port, args.profile, args.backend, args.seed))


if __name__ == "__main__":
    main()
