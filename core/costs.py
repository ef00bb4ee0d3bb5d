"""What one request cost (Appstats for today), counted where each round trip leaves the process: every Datastore RPC
by a gRPC interceptor (core.datastore.RpcCounter), billed as production bills it (core/billing.py); every cache call by
the client the app and ndb's global cache share (core.cache.CountedClient). A request's `Cost` is `current()`. No
Flask here, so benchmarks count costs too."""
import contextlib
import contextvars
import dataclasses
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from core import billing, production_latency

MOST_CALLS = 300  # calls kept per request for its timeline (/appstats/<id>), the first answered; all are counted
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # control characters: no header value or log line may have one


@dataclass(frozen=True)
class TimedTrip:
    """One round trip (an RPC, a cache call) as its request timed it, in milliseconds from the request's start: when it
    was made and when it was answered. Not production_latency.RoundTrip, a modelled round trip's distribution."""
    kind: str  # "datastore" or "cache"
    name: str  # the RPC's method ("Lookup") or the cache call ("get_many")
    start_ms: float
    end_ms: float
    # Of its time, production's wait under a profile (LATENCY): what the stand-in reported waiting for an RPC, what the
    # app's process waited before a cache call. The rest is this machine's own. 0 without a profile.
    wait_ms: float = 0.0

    @property
    def machine_ms(self) -> float:  # this machine's own time for the round trip
        return max(self.end_ms - self.start_ms - self.wait_ms, 0.0)


@dataclass
class Cost:
    """One request's RPCs and cache calls: counts by method, their summed time, the bill, and each call's times."""
    started: float = field(default_factory=time.perf_counter)
    datastore: Counter[str] = field(default_factory=Counter)  # RPCs by method
    cache: Counter[str] = field(default_factory=Counter)  # cache calls by name
    datastore_s: float = 0.0
    cache_s: float = 0.0
    waited_s: float = 0.0  # of the times above, what the production latency model made them wait (LATENCY)
    retried: int = 0  # transactions tried again after a collision (core.transactions.transact)
    billed: billing.Billed = field(default_factory=billing.Billed)
    billed_from: Counter[str] = field(default_factory=Counter)  # what the bill is made of: found, skipped, ...
    calls: list[TimedTrip] = field(default_factory=list)  # the first MOST_CALLS calls, in the order they were answered
    ended: float | None = None  # when the response was ready (`end`): the request's time stops there
    # An RPC's answer may arrive on a gRPC thread while the request reads its figures: every change and read locks.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_rpc(self, method: str, started: float, billed: billing.Billed | None = None,
                billed_from: dict[str, int] | None = None, waited: float = 0.0) -> None:
        """An RPC made at `started` and answered now, `waited` seconds of it the stand-in's; a failed one: no bill."""
        with self.lock:
            self.datastore[method] += 1
            self.waited_s += waited
            self.datastore_s += self._keep("datastore", method, started, waited)
            if billed is not None:
                self.billed += billed
                self.billed_from.update(billed_from or {})

    def add_cache(self, call: str, started: float, waited: float = 0.0) -> None:
        """A cache call made at `started` and answered now, `waited` seconds of it the profile's modelled wait."""
        with self.lock:
            self.cache[call] += 1
            self.waited_s += waited
            self.cache_s += self._keep("cache", call, started, waited)

    def _keep(self, kind: str, name: str, started: float, waited: float) -> float:
        ended = time.perf_counter()
        if len(self.calls) < MOST_CALLS and self.ended is None:  # the response's figures are those until it ended
            self.calls.append(TimedTrip(kind, name, (started - self.started) * 1000, (ended - self.started) * 1000,
                                        waited * 1000))
        return ended - started

    def add_wait(self, seconds: float) -> None:
        with self.lock:
            self.waited_s += seconds

    def add_retry(self) -> None:
        with self.lock:
            self.retried += 1

    def end(self) -> None:
        with self.lock:  # an RPC answered on a gRPC thread reads `ended` in _keep, under the lock
            self.ended = time.perf_counter()

    def app_ms(self) -> float:
        """The request's milliseconds so far, or until it ended."""
        return ((self.ended or time.perf_counter()) - self.started) * 1000

    def server_timing(self) -> str:
        """The W3C Server-Timing header's value: `datastore;desc="2 RPCs: 1 Lookup, 1 RunQuery";dur=4.1, cache;...,
        billed;desc="11 reads: $3.30 per million", app;dur=5.0` (billed has no duration: it is production's bill)."""
        with self.lock:
            value = (f'datastore;desc="{described(self.datastore, "RPC")}";dur={self.datastore_s * 1000:.1f}, '
                     f'cache;desc="{described(self.cache, "call")}";dur={self.cache_s * 1000:.1f}, '
                     f'billed;desc="{self.billed.priced()}", app;dur={self.app_ms():.1f}')
            if self.retried:
                value += f', retried;desc="{plural(self.retried, "transaction")} retried after a collision"'
            if self.waited_s:
                value += f', model;desc="{production_latency.label()}: modelled waits";dur={self.waited_s * 1000:.1f}'
        return CONTROL.sub("?", value)  # the names come from the code, but a header value must never break its line

    def footer(self, cache_name: str) -> str:
        """'2 Datastore RPCs (4.1 ms), 1 memcached call (0.3 ms); billed in production: 11 reads: $3.30 per million
        such requests', as a page's footer says it."""
        with self.lock:
            text = (f"{plural(self.datastore.total(), 'Datastore RPC')} ({self.datastore_s * 1000:.1f} ms), "
                    f"{plural(self.cache.total(), cache_name + ' call')} ({self.cache_s * 1000:.1f} ms); "
                    f"billed in production: {self.billed.priced(' such requests')}")
            if self.waited_s:
                text += f"; {self.waited_s * 1000:.1f} ms of it modelled production waits, {production_latency.label()}"
        return text

    def kept_calls(self) -> list[TimedTrip]:
        """The calls kept until the request ended, in the order they were made."""
        with self.lock:
            return sorted(self.calls, key=lambda call: call.start_ms)

    def figures(self, cache_backend: str) -> dict[str, Any]:
        """The figures as the log line, /appstats and its API give them."""
        with self.lock:
            billed = {**dataclasses.asdict(self.billed), "usd_per_million": round(self.billed.usd_per_million(), 4)}
            return {"datastore": {"rpcs": self.datastore.total(), "ms": round(self.datastore_s * 1000, 1),
                                  "by_method": dict(self.datastore)},
                    "billed": {**billed, "counted": {k: n for k, n in self.billed_from.items() if n}},
                    "cache": {"backend": cache_backend, "calls": self.cache.total(),
                              "ms": round(self.cache_s * 1000, 1), "by_call": dict(self.cache)},
                    "app_ms": round(self.app_ms(), 1)}


def timeline(calls: list[TimedTrip], counted: int) -> dict[str, Any]:
    """`calls` with the critical path among them marked, and how many of the `counted` were not kept (`cut`)."""
    critical = critical_path(calls)
    return {"calls": [{**dataclasses.asdict(call), "machine_ms": round(call.machine_ms, 3), "critical": i in critical}
                      for i, call in enumerate(calls)],
            "cut": max(counted - len(calls), 0)}


def critical_path(calls: list[TimedTrip]) -> set[int]:
    """The indexes (in `calls`, sorted by start) of the longest chain, in summed time, of calls each made after the one
    before it was answered: the calls the request waited for one after another."""
    longest: list[tuple[float, int]] = []  # for each call: the longest chain's time ending with it, the call before
    for i, call in enumerate(calls):
        before = [(longest[j][0], j) for j in range(i) if calls[j].end_ms <= call.start_ms]
        total, previous = max(before, default=(0.0, -1))  # on a tie, the later call before it
        longest.append((total + call.end_ms - call.start_ms, previous))
    chain: set[int] = set()
    i = max(range(len(calls)), key=lambda k: longest[k][0], default=-1)  # the call that ends the longest chain
    while i >= 0:
        chain.add(i)
        i = longest[i][1]
    return chain


def plural(n: int, noun: str, many: str | None = None) -> str:
    """'1 shard', '2 shards'; `many` for a noun whose plural is not noun + s ('entity', 'entities')."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def described(counts: Counter[str], noun: str) -> str:
    """'3 RPCs: 2 Lookup, 1 RunQuery', the most made first."""
    detail = ", ".join(f"{n} {name}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return plural(counts.total(), noun) + (f": {detail}" if detail else "")


_current: contextvars.ContextVar[Cost | None] = contextvars.ContextVar("request_cost", default=None)


def current() -> Cost | None:
    """The cost of the request being served, or None outside one."""
    return _current.get()


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
