"""Numbers everyone should know (the /numbers page), measured on the running stack beside the talk's 2008 rules of
thumb (not `numbers`: that would shadow Python's module). Bounded work: RUNS timed calls of each operation, each cut
short after TIME_LIMIT seconds, one measurement at a time; the probes are overwritten, never added to.
"""
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.cloud import ndb

from core import clock, people, production_latency, runtime
from core.errors import Conflict
from core.transactions import transact
from latency.models import Measurement, Probe

RUNS = 15
TIME_LIMIT = 3.0  # seconds per operation, whatever the stack's speed
BATCH = 20
LATEST = "latest"
LOCK_KEY = "numbers:measuring"
LOCK_SECONDS = 60
PAYLOAD = "x" * 100
CACHE_VALUE = b"x" * 1024
# Twenty children of one parent: an ancestor query reads them back in key order, strongly consistent, with the
# kind's built-in index (no composite index needed).
BATCH_PARENT = ("Probe", "batch")


@dataclass(frozen=True)
class Operation:
    name: str
    label: str
    talk: str  # what the 2008 talk said about it
    talk_ms: float | None = None
    entities: int = 1  # how many entities one call handles


OPERATIONS = (
    Operation("txn_write", "Transactional write of one entity",
              "About 10 ms: a write is a disk seek, so ~100 a second at most "
              "(\u201cWrites are expensive!\u201d)", 10.0),
    Operation("batch_put", f"Batch put of {BATCH} entities",
              "\u201cDo work in batches\u201d: one call for many entities instead of a call each", entities=BATCH),
    Operation("get", "Get one entity by key",
              "\u201cReads are cheap!\u201d: read from disk once, then from memory; writes cost ~40 times more"),
    Operation("get_multi", f"Get {BATCH} entities by key (one get_multi)",
              "Batch gets: one round trip for all of them", entities=BATCH),
    Operation("query", f"Query of {BATCH} entities (ancestor)", "No figure in the talk", entities=BATCH),
    Operation("memcache_get", "memcache get of 1 KB",
              "0.25 ms to read 1 MB from memory; 0.5 ms a round trip within a datacenter (J. Dean)", 0.5),
)


def _calls() -> dict[str, Callable[[], object]]:
    """{operation name: a function doing it once}. Every Datastore call here bypasses ndb's caches (Probe says so)."""
    cache = runtime.cache()
    parent = ndb.Key(*BATCH_PARENT)
    keys = [ndb.Key(Probe, i + 1, parent=parent) for i in range(BATCH)]
    write_number = iter(range(1, 10_000))

    def txn_write() -> None:
        # A different root entity each time: successive writes never wait on one entity group's commit. Two
        # measurements can overlap only while memcached is away (no claim): then a collision is retried at once.
        probe = Probe(id=f"write-{next(write_number) % (RUNS + 1)}", value=1, text=PAYLOAD)
        transact(probe.put, max_attempts=5)

    def batch_put() -> None:
        ndb.put_multi([Probe(key=k, value=i, text=PAYLOAD) for i, k in enumerate(keys)])

    def query() -> None:
        found = Probe.query(ancestor=parent).fetch(BATCH)
        assert len(found) == BATCH, found

    return {
        "txn_write": txn_write,
        "batch_put": batch_put,
        "get": lambda: keys[0].get(),
        "get_multi": lambda: ndb.get_multi(keys),
        "query": query,
        "memcache_get": lambda: cache.get(LOCK_KEY + ":probe"),
    }


def _time(fn: Callable[[], object]) -> dict[str, float]:
    fn()  # warm-up: the first call may open a connection
    times = []
    deadline = time.perf_counter() + TIME_LIMIT
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
        if time.perf_counter() > deadline:
            break
    times.sort()
    return {"median_ms": round(statistics.median(times), 3),
            "p90_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))], 3), "runs": len(times)}


BACKEND_NAMES = {"legacy": "the legacy Datastore emulator", "firestore": "the Firestore emulator in Datastore mode"}


def measure(by: str) -> dict[str, Any]:
    """Time every operation now (`by`: the admin's display name), keep the result as the latest measurement and
    return it; 409 while another measurement runs (the cache holds the claim)."""
    cache = runtime.cache()
    if cache.add(LOCK_KEY, 1, LOCK_SECONDS) is False:  # None (the cache away) cannot keep measurements apart
        raise Conflict("A measurement is running already; its figures will be here in a few seconds.", "measuring")
    try:
        cache.add(LOCK_KEY + ":probe", CACHE_VALUE, expire=LOCK_SECONDS)  # what memcache_get reads: 1 KB
        memcache_up = cache.get(LOCK_KEY + ":probe") is not None
        calls = _calls()
        calls["batch_put"]()  # the entities the reads below read
        rows = []
        for op in OPERATIONS:
            if op.name == "memcache_get" and not memcache_up:
                continue  # memcached is away: measurement_dict shows this row unmeasured
            rows.append({"name": op.name, **_time(calls[op.name])})
        settings = runtime.current().settings
        name = BACKEND_NAMES[settings.backend] if settings.emulator_host else "Firestore in Datastore mode"
        measurement = Measurement(id=LATEST, measured=clock.now(), by=by, backend=settings.backend,
                                  backend_name=name, runs=RUNS, operations=rows, latency=settings.latency)
        measurement.put()
        return measurement_dict(measurement)
    finally:
        cache.delete(LOCK_KEY)


def page() -> dict[str, Any]:
    """What the numbers page shows: the latest measurement, the model and the stand-in's figures."""
    return {"numbers": latest(), "runs": RUNS, "model": runtime.current().latency, "standin": standin()}


def standin() -> dict[str, Any]:
    """Every figure the stand-in waits by, as core/production_latency.py defines and cites it (its knobs, each RPC's
    median round trip under each profile, the tail's steps), each published or an inference, with its sources."""
    knobs = [{"name": k.name, "label": k.label, "value": k.value, "unit": k.unit,
              "whose": "published" if k.published else "inference", "source": k.source, "links": list(k.links)}
             for k in production_latency.STAND_IN_KNOBS]
    round_trips = []
    for method in production_latency.DATASTORE:
        median_ms, whose, sources = {}, {}, {}
        for profile in production_latency.PROFILES:
            trip = production_latency.PROFILE_DATASTORE[profile][method]
            said, links = production_latency.cited(method, trip)
            said = f"{profile}: {said}" if trip is production_latency.MULTI_REGION_COMMIT else said
            median_ms[profile] = trip.median_ms
            whose[profile] = "inference" if production_latency.INFERENCE in said else "published"
            sources[said] = links  # a figure both profiles share is cited once
        round_trips.append({"method": method, "median_ms": median_ms, "whose": whose, "source": "; ".join(sources),
                            "links": [link for links in sources.values() for link in links]})
    steps = [{"quantile": q, "ms": ms, "ratio": round(ratio, 4)} for q, ms, ratio in production_latency.tail_steps()]
    return {"profile": runtime.current().latency.name, "knobs": knobs, "round_trips": round_trips,
            "tail": {"steps": steps, "whose": "published", "source": production_latency.TAIL_SOURCE,
                     "links": list(production_latency.TAIL_LINKS)}}


def latest() -> dict[str, Any] | None:
    """The latest measurement (a get by key), or None when nothing was measured yet."""
    measurement = ndb.Key(Measurement, LATEST).get()
    return None if measurement is None else measurement_dict(measurement)


def measurement_dict(measurement: Measurement) -> dict[str, Any]:
    measured = {row["name"]: row for row in measurement.operations}
    operations = []
    for op in OPERATIONS:
        row = measured.get(op.name, {"median_ms": None, "p90_ms": None, "runs": 0})
        per_item = (round(row["median_ms"] / op.entities, 3) if row["median_ms"] is not None and op.entities > 1
                    else None)
        operations.append({"name": op.name, "label": op.label, "median_ms": row["median_ms"], "p90_ms": row["p90_ms"],
                           "per_item_ms": per_item, "runs": row["runs"], "talk": op.talk, "talk_ms": op.talk_ms})
    write, read = measured.get("txn_write", {}).get("median_ms"), measured.get("get", {}).get("median_ms")
    # A measurement kept before `by` held display names holds an address: anyone may read this, so it is shown as one.
    by = measurement.by and people.display_name(measurement.by)
    return {"measured": clock.iso(measurement.measured), "by": by,
            "backend": measurement.backend or "legacy",
            "backend_name": measurement.backend_name or BACKEND_NAMES["legacy"],
            "runs": measurement.runs, "operations": operations,
            # a profile ("production", "multi-region"): each figure includes its modelled round trips
            "latency": measurement.latency or "none",
            # The talk's lesson in one figure: how many reads one transactional write costs (the talk: about 40).
            "write_read_ratio": round(write / read, 1) if write and read else None}
