"""LATENCY=production: the local stack made to wait where production waits.

Both emulators and the cache run on this machine and answer in well under a millisecond, so the lessons that are
about waiting (a transaction holds its entity group for several round trips; work spread over many tasks overlaps
its waits) do not show here. With this model on, every Datastore RPC and every cache call waits, before it is sent,
a round trip drawn from the distribution below, on the thread that makes it. Waiting before sending (not after the
answer) keeps a transaction's window on the server as long as production's: BeginTransaction, then each Lookup, then
Commit reach the emulator one modelled round trip apart.

The figures. Google publishes no per-method latency for Firestore in Datastore mode or Memorystore, so the medians
and 99th percentiles below are ASSUMPTIONS, chosen from what is published:
- An App Engine instance and its database in one region: a round trip inside a data centre is about 0.5 ms
  (J. Dean, "Numbers Everyone Should Know",
  https://static.googleusercontent.com/media/research.google.com/en//people/jeff/stanford-295-talk.pdf), and the
  database's front ends add their own work to it.
- A write is slower than a read: a regional database "operates in a multi-zone replicated configuration" and a
  multi-region one replicates across regions (https://cloud.google.com/datastore/docs/locations), so a Commit waits
  for a quorum of replicas in other zones, while a Lookup or a query is answered by one.
- The talk (2008) put a datastore write at about 10 ms ("writes are expensive") and reads far below it.
- Memorystore is in the same region's VPC: "sub-millisecond" is its own description
  (https://cloud.google.com/memorystore/docs/redis/memorystore-for-redis-overview).
Each wait is drawn from a log-normal distribution with that median and 99th percentile (latencies have a long right
tail, never a negative one), capped at twice the p99 so one draw cannot stall a benchmark. Change them here: this is
the one place the model is defined; the footer, Server-Timing and /numbers show its waits beside the measured times.
"""
import math
import random
import threading
import time
from dataclasses import dataclass

NAMES = ("none", "production")


@dataclass(frozen=True)
class RoundTrip:
    """One kind of call's modelled round trip, in milliseconds."""
    median_ms: float
    p99_ms: float

    def draw(self, rng: random.Random) -> float:
        """A round trip in seconds."""
        sigma = math.log(self.p99_ms / self.median_ms) / 2.326  # z of the 99th percentile
        return min(self.median_ms * math.exp(sigma * rng.normalvariate(0, 1)), 2 * self.p99_ms) / 1000


# Datastore RPCs by gRPC method (google.datastore.v1.Datastore), as App Engine sees Firestore in Datastore mode in its
# own region: assumptions (see above).
DATASTORE = {
    "Lookup": RoundTrip(4, 15),
    "RunQuery": RoundTrip(6, 25),
    "RunAggregationQuery": RoundTrip(10, 40),
    "BeginTransaction": RoundTrip(4, 15),
    "Commit": RoundTrip(12, 50),  # replicated to a quorum in other zones before it answers
    "Rollback": RoundTrip(4, 15),
    "AllocateIds": RoundTrip(4, 15),
    "ReserveIds": RoundTrip(4, 15),
}
CACHE = RoundTrip(0.5, 2)  # Memorystore in the same region (an assumption within its "sub-millisecond")
UNKNOWN_RPC = RoundTrip(6, 25)


class Model:
    """The waits of one app's stack: none (the default), or production's (`LATENCY=production`, local stacks only).
    Thread-safe: one per process, used by every request thread."""

    def __init__(self, name: str = "none") -> None:
        if name not in NAMES:
            raise ValueError(f"LATENCY must be one of {', '.join(NAMES)}, not {name!r}")
        self.on = name == "production"
        self._rng = random.Random()
        self._lock = threading.Lock()  # random.Random's normalvariate keeps state between calls

    def before_rpc(self, method: str) -> float:
        """Wait a Datastore RPC's modelled round trip (nothing when off); the seconds waited."""
        return self._wait(DATASTORE.get(method, UNKNOWN_RPC)) if self.on else 0.0

    def before_cache_call(self) -> float:
        """Wait a cache call's modelled round trip (nothing when off); the seconds waited."""
        return self._wait(CACHE) if self.on else 0.0

    def _wait(self, trip: RoundTrip) -> float:
        with self._lock:
            seconds = trip.draw(self._rng)
        time.sleep(seconds)
        return seconds

    def describe(self) -> list[dict]:
        """The model's figures, for /numbers and the benchmarks' reports."""
        return [{"call": name, "median_ms": trip.median_ms, "p99_ms": trip.p99_ms}
                for name, trip in [*DATASTORE.items(), ("cache call", CACHE)]]


OFF = Model()
