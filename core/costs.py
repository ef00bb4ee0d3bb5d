"""A request's costs (Appstats for today): its Datastore RPCs and cache calls, counted where they leave the process.

- Datastore: a gRPC client interceptor on the channel ndb uses (and on the Datastore API client beside it), so every
  RPC is seen by method (Lookup, RunQuery, RunAggregationQuery, BeginTransaction, Commit, Rollback, AllocateIds),
  whoever made it, ndb's batches and retries included. Timed from the call to its answer (ndb sends RPCs
  asynchronously: the answer comes back on a gRPC thread, hence the lock).
- What each RPC is billed in production (core/billing.py), read from the same RPC's request and answer: entities
  found, missing, returned and skipped, index entries counted, entities written and deleted. Unlike the time, these
  counts are the same on an emulator as in production.
- The cache: the client object itself is wrapped (`CountedClient`), the one that both the app's explicit calls and
  ndb's global cache go through, so a get_many ndb makes for its global cache counts like one the app makes.
Each request gets a `Cost` (core.runtime.RequestMiddleware); appstats/accounting.py shows it in the request's
`Server-Timing` header, its page's footer and one log line, and keeps it among the last requests for /appstats. Free
of Flask, like everything below core/web.py (pyproject.toml's contract): benchmarks and scripts count costs too.
"""
import collections
import contextlib
import contextvars
import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from core import billing
from core.production_latency import OFF, Model

_current: contextvars.ContextVar["Cost | None"] = contextvars.ContextVar("request_cost", default=None)


_NOTHING = billing.Billed()
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # control characters: no header value or log line has one


class Cost:
    """One request's RPCs and cache calls: counts by method and their summed time."""

    # A Cost is made for every request, and the accounting must stay a few microseconds of it (bench/overhead.py's
    # on/off target): slots, plain dicts rather than Counters, the bill of nothing shared until there is one, its
    # cache calls as a CacheMix that already knows its texts, and, once there are RPCs, the texts of its mix of calls
    # (`Texts`) found once for the footer, the header and the log line, unless a call came in between.
    __slots__ = ("started", "datastore", "datastore_s", "cache_s", "waited_s", "retried", "billed", "counted", "_lock",
                 "_calls", "_mix", "_texts", "_texts_at")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.datastore: dict[str, int] = {}
        self._mix = _NO_CALL  # its cache calls so far (CacheMix)
        self.datastore_s = 0.0
        self.cache_s = 0.0
        self.waited_s = 0.0  # of the times above, what the production latency model made it wait (LATENCY)
        self.retried = 0  # transactions tried again after a collision (core.transactions.transact)
        self.billed = _NOTHING  # never changed in place: `+=` makes a new Billed
        self.counted: dict[str, int] = {}  # what the bill was counted from: found, missing, skipped, ...
        self._lock = threading.Lock()
        self._calls = 0  # every RPC and cache call so far: the texts found at another count are another mix's
        self._texts: Texts | None = None
        self._texts_at = -1

    def add_rpc(self, method: str, seconds: float, billed: billing.Billed | None = None,
                counted: dict[str, int] | None = None) -> None:
        with self._lock:
            self.datastore[method] = self.datastore.get(method, 0) + 1
            self.datastore_s += seconds
            self._calls += 1
            if billed is not None:
                self.billed += billed
                for what, n in (counted or {}).items():
                    self.counted[what] = self.counted.get(what, 0) + n

    def add_wait(self, seconds: float) -> None:
        with self._lock:
            self.waited_s += seconds

    def add_retry(self) -> None:
        with self._lock:
            self.retried += 1

    def add_cache(self, call: str, seconds: float) -> None:
        # acquire/release rather than `with`: half the instructions, here and in now(), which every request runs
        self._lock.acquire()
        try:
            self._mix = self._mix.then(call)
            self.cache_s += seconds
            self._calls += 1
        finally:
            self._lock.release()

    def now(self) -> tuple["Texts", float, float, float]:
        """The texts of the calls so far, their Datastore and cache milliseconds, and the request's so far: one
        consistent view (an RPC's answer may be counted on a gRPC thread meanwhile), in one call."""
        self._lock.acquire()
        try:
            texts: Texts | None
            if not self.datastore:  # no RPC (and so no bill): the texts of the cache calls' mix, found as they came
                texts = self._mix.texts
            elif (texts := self._texts) is None or self._texts_at != self._calls:
                billed = self.billed
                texts = self._texts = _texts(tuple(self.datastore.items()), self._mix.counts,
                                             (billed.reads, billed.writes, billed.deletes, billed.small),
                                             tuple(self.counted.items()))
                self._texts_at = self._calls
            return texts, self.datastore_s * 1000, self.cache_s * 1000, (time.perf_counter() - self.started) * 1000
        finally:
            self._lock.release()


class Texts:
    """One mix of calls and bill: the RPCs and cache calls by method, and what production bills them. Every request
    with the same mix has the same (most requests have one of a few), so what is said of it is worked out once per
    process, as a %-format with a slot (%.1f) for each time, and a request only formats its times into it. Found by
    `_texts`; the footer's and the log line's texts are kept by (Texts, cache name), which hashes as fast as an
    object can (by identity). `server_timing`: the W3C Server-Timing header's value,
    `datastore;desc="2 RPCs: 1 Lookup, 1 RunQuery";dur=4.1, ..., billed;desc="11 reads: $3.30 per million"` (a
    metric without a duration: what production would bill), for the Datastore, cache and request milliseconds."""

    __slots__ = ("datastore", "cache", "billed", "counted", "rpcs", "cache_calls", "server_timing")

    def __init__(self, datastore: tuple[tuple[str, int], ...], cache: tuple[tuple[str, int], ...],
                 billed: billing.Billed, counted: tuple[tuple[str, int], ...]) -> None:
        self.datastore, self.cache, self.billed, self.counted = datastore, cache, billed, counted
        self.rpcs, self.cache_calls = sum(n for _, n in datastore), sum(n for _, n in cache)
        bill = _slotted(_billed_text(billed.reads, billed.writes, billed.deletes))
        self.server_timing = (f'datastore;desc="{_slotted(_described(datastore, "RPC"))}";dur=%.1f, '
                              f'cache;desc="{_slotted(_described(cache, "call"))}";dur=%.1f, '
                              f'billed;desc="{bill}", app;dur=%.1f')
        if CONTROL.search(self.server_timing):  # names the code gave: a header value may not break its line
            raise ValueError(f"not a header value: {self.server_timing!r}")

    def figures(self, cache_backend: str, datastore_ms: Any, cache_ms: Any, app_ms: Any) -> dict[str, Any]:
        """A dict of the figures, as the log line, the admin view and the API give them; the cache's under "cache",
        its backend ("memcached", "redis" or "none") named inside. The times as given: numbers, or the slots of a
        template (appstats.accounting's JSON line)."""
        return {"datastore": {"rpcs": self.rpcs, "ms": datastore_ms,
                              "by_method": dict(self.datastore)},
                "billed": {**self.billed.as_dict(), "counted": {k: n for k, n in self.counted if n}},
                "cache": {"backend": cache_backend, "calls": self.cache_calls, "ms": cache_ms,
                          "by_call": dict(self.cache)},
                "app_ms": app_ms}


class CacheMix:
    """A mix of cache calls, as counts by call (`counts`, by name), with the texts of a request that made these and no
    Datastore RPC (a kept page or feed, what most visitors get), and the mix one call more of each name makes
    (`then`).
    Mixes link up as requests make their calls, so that a request finds its mix one dict lookup per call as they
    come in, rather than by hashing all its counts when its texts are wanted (that was two thirds of a request's
    first look at its texts: 565 of 876 ns, in a loop). Links stop at LINKS mixes per process (past that, a mix is
    found by its counts), so that odd requests cannot grow them without bound."""

    __slots__ = ("counts", "texts", "_after")
    LINKS = 4096
    linked = 0  # mixes linked so far in this process (counted loosely: a race only links one more)

    def __init__(self, counts: tuple[tuple[str, int], ...]) -> None:
        self.counts = counts
        self.texts = _texts((), counts, (0, 0, 0, 0), ())
        self._after: dict[str, CacheMix] = {}

    def then(self, call: str) -> "CacheMix":
        mix = self._after.get(call)
        if mix is None:
            counts = dict(self.counts)
            counts[call] = counts.get(call, 0) + 1
            mix = _cache_mix(tuple(sorted(counts.items())))
            if CacheMix.linked < CacheMix.LINKS:
                CacheMix.linked += 1
                self._after[call] = mix
        return mix


@functools.lru_cache(maxsize=1024)
def _cache_mix(counts: tuple[tuple[str, int], ...]) -> CacheMix:
    return CacheMix(counts)


_BILLED_METRIC = re.compile(r'billed;desc="(?P<desc>[^"]*)"')


def billed_from_server_timing(header: str | None) -> billing.Billed:
    """The billing.Billed a Server-Timing header's `billed` metric states (for benchmarks and tests reading it back
    from responses): nothing when it has none."""
    match = _BILLED_METRIC.search(header or "")
    counts = {what.rstrip("s"): int(n) for n, what in
              re.findall(r"(\d+) (reads?|writes?|deletes?)", match["desc"] if match else "")}
    return billing.Billed(reads=counts.get("read", 0), writes=counts.get("write", 0), deletes=counts.get("delete", 0))


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# The texts below are worked out once per process for each mix of calls and bill, with a slot (%.1f) for each time:
# every request has one, most requests have one of a few, and a request then only formats its times into it.
@functools.lru_cache(maxsize=1024)
def _described(counts: tuple[tuple[str, int], ...], noun: str) -> str:
    """'3 RPCs: 2 Lookup, 1 RunQuery' for ((name, n), ...)."""
    total = sum(n for _, n in counts)
    detail = ", ".join(f"{n} {name}" for name, n in sorted(counts, key=lambda kv: (-kv[1], kv[0])))
    return plural(total, noun) + (f": {detail}" if detail else "")


def _slotted(text: str) -> str:
    """`text` as a %-format's fixed part."""
    return text.replace("%", "%%")


@functools.lru_cache(maxsize=1024)
def _texts(datastore: tuple[tuple[str, int], ...], cache: tuple[tuple[str, int], ...],
           bill: tuple[int, int, int, int], counted: tuple[tuple[str, int], ...]) -> Texts:
    return Texts(datastore, cache, billing.Billed(*bill), counted)


@functools.lru_cache(maxsize=1024)
def footer_template(texts: Texts, cache_name: str) -> str:
    """The footer of `texts`, '2 Datastore RPCs (4.1 ms), 1 memcached call (0.3 ms); billed in production: 11 reads
    ($3.30 per million such requests)', with a slot (%.1f) for each of its two times."""
    billed = _billed_text(texts.billed.reads, texts.billed.writes, texts.billed.deletes, " such requests")
    return (f"{_slotted(plural(texts.rpcs, 'Datastore RPC'))} (%.1f ms), "
            f"{_slotted(plural(texts.cache_calls, cache_name + ' call'))} (%.1f ms); "
            f"billed in production: {_slotted(billed)}")


@functools.lru_cache(maxsize=1024)
def _billed_text(reads: int, writes: int, deletes: int, requests: str = "") -> str:
    """'11 reads: $3.30 per million', or 'nothing in Datastore'."""
    if not (reads or writes or deletes):
        return "nothing in Datastore"
    billed = billing.Billed(reads=reads, writes=writes, deletes=deletes)
    return f"{billed.describe()}: ${billed.usd_per_million():.2f} per million{requests}"


_NO_CALL = _cache_mix(())

# current(): the cost of the request being served, or None outside one. The ContextVar's own get, called by every
# request more than once: no Python frame around it.
current: Callable[[], Cost | None] = _current.get


@contextlib.contextmanager
def measuring(cost: Cost | None) -> Iterator[Cost | None]:
    """What the block does is counted in `cost` (None: not counted)."""
    token = _current.set(cost)
    try:
        yield cost
    finally:
        _current.reset(token)


def measured() -> contextlib.AbstractContextManager[Cost | None]:
    """`with measured() as cost:` counts what the block does (a request, or a script's step) in a new Cost."""
    return measuring(Cost())


class RpcCounter(grpc.UnaryUnaryClientInterceptor):
    """Every unary Datastore RPC, counted for the request that sent it. The request is found when the call is made
    (on the request's thread, in its context); the answer may arrive on a gRPC thread, which only adds to that cost.
    Under a production latency model (`model`), the RPC first waits its modelled round trip, timed with it."""

    def __init__(self, model: Model = OFF) -> None:
        self.model = model

    def intercept_unary_unary(self, continuation: Callable, client_call_details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        cost = _current.get()
        started = time.perf_counter()
        method = client_call_details.method
        method = method.rsplit("/", 1)[-1] if isinstance(method, str) else method.decode().rsplit("/", 1)[-1]
        if self.model.on:
            waited = self.model.before_rpc(method)
            if cost is not None:
                cost.add_wait(waited)
        outcome = continuation(client_call_details, request)
        if cost is not None:

            def done(answered: grpc.Future) -> None:
                seconds = time.perf_counter() - started
                billed, counted = (billing.of(method, request, answered.result()) if answered.exception() is None
                                   else (None, None))  # a failed RPC is not billed its reads or writes
                cost.add_rpc(method, seconds, billed, counted)
            outcome.add_done_callback(done)
        return outcome


def intercepted(channel: grpc.Channel, model: Model = OFF) -> grpc.Channel:
    """`channel` with every RPC counted, after its modelled wait under `model` (a public gRPC API:
    grpc.intercept_channel)."""
    return grpc.intercept_channel(channel, RpcCounter(model))


class CountedClient:
    """A cache client with every call counted for the current request, whatever the client (pymemcache, redis-py, the
    app's Redis adapter). redis-py pipelines (ndb's RedisCache compare-and-swap) are counted by their round trips, and
    each round trip first waits its modelled time under a production latency model (`model`)."""

    PIPELINE_ROUND_TRIPS = frozenset({"watch", "unwatch", "get", "execute"})  # multi, set... only queue commands

    def __init__(self, client: Any, prefix: str = "", model: Model = OFF) -> None:
        self._client = client
        self._prefix = prefix
        self._model = model

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name.startswith("_") or not callable(attribute):
            return attribute
        if name == "pipeline":
            return lambda *args, **kwargs: CountedClient(attribute(*args, **kwargs), prefix="pipeline.",
                                                         model=self._model)
        if self._prefix and name not in self.PIPELINE_ROUND_TRIPS:
            return attribute

        counted_as = self._prefix + name
        model = self._model

        def call(*args, **kwargs):
            cost = _current.get()
            started = time.perf_counter()
            if model.on:
                waited = model.before_cache_call()
                if cost is not None:
                    cost.add_wait(waited)
            try:
                return attribute(*args, **kwargs)
            finally:
                if cost is not None:
                    cost.add_cache(counted_as, time.perf_counter() - started)
        self.__dict__[name] = call  # made once: the next lookup finds it without coming here
        return call


class Recent:
    """The last `size` requests' costs in this process, newest first (bounded: a deque), for /appstats."""

    def __init__(self, size: int = 100) -> None:
        self._items: collections.deque[Any] = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, *records: Any) -> None:
        """`records`, oldest first."""
        with self._lock:
            self._items.extendleft(records)

    def items(self) -> list[Any]:
        with self._lock:
            return list(self._items)
