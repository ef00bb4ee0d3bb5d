"""LATENCY=production or LATENCY=multi-region: the local stack made to wait where production waits, every call a round
trip drawn from published figures (each cited beside it; INF: an inference, to measure in production). Datastore RPCs
wait in the stand-in (devstack/standin.py), cache calls and Cloud Tasks in the app's process (Model). The one place
the model is defined; why it waits where it does: docs/lessons/numbers.md, "Where production waits"."""
import contextvars
import math
import random
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

NAMES = ("none", "production", "multi-region")  # LATENCY's values: off, and the two profiles
PROFILES = NAMES[1:]

_NORMAL = statistics.NormalDist()
# The tail: googleapis/nodejs-firestore#1994 (2024-02-04), GetDocument's "Without `readTime`" column (strong reads),
# whose rounded labels stand for the steps 1 - 2**-k (numbers.md, "The tail"). Here: (step, that step's ms / the
# median's 17 ms), every published step, the last one the cap.
_STRONG_READ_MS = (17, 18, 20, 21, 23, 27, 32, 45, 70, 86, 112, 359, 565, 1326)  # steps 1 - 2**-1 ... 1 - 2**-14
SHAPE = tuple((1 - 2 ** -k, ms / _STRONG_READ_MS[0]) for k, ms in enumerate(_STRONG_READ_MS[1:], start=2))


class Waits(Protocol):
    """What keeps a request's waits (core.costs.Cost)."""
    def add_wait(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class RoundTrip:
    """One kind of call's modelled round trip: its median in milliseconds and its tail, (quantile, that quantile /
    the median) from a published histogram, increasing. Nothing is drawn beyond the last point (the cap)."""
    median_ms: float
    tail: tuple[tuple[float, float], ...] = SHAPE

    def quantile_ms(self, q: float) -> float:
        """The q-quantile, milliseconds: log-linear between the published points in normal-quantile steps (a
        log-normal between each pair), the lower half the first step above the median mirrored, capped at the last."""
        points = [(0.0, 0.0), *((_NORMAL.inv_cdf(p), math.log(ratio)) for p, ratio in self.tail)]
        z = _NORMAL.inv_cdf(min(max(q, 1e-9), 1 - 1e-9))
        if z <= 0:  # below the median: the first step's slope, mirrored
            z1, log1 = points[1]
            return self.median_ms * math.exp(z * log1 / z1)
        for (z0, log0), (z1, log1) in zip(points, points[1:], strict=False):
            if z <= z1:
                return min(self.median_ms * math.exp(log0 + (log1 - log0) * (z - z0) / (z1 - z0)), self.cap_ms)
        return self.cap_ms  # the last published point

    @property
    def p99_ms(self) -> float:
        return self.quantile_ms(0.99)

    @property
    def p999_ms(self) -> float:
        return self.quantile_ms(0.999)

    @property
    def cap_ms(self) -> float:
        return self.median_ms * self.tail[-1][1]

    def draw(self, rng: random.Random) -> float:
        """A round trip in seconds."""
        return self.quantile_ms(rng.random()) / 1000


# Datastore RPCs by gRPC method. The three medians: googleapis/google-cloud-dotnet#5333 (Jon Skeet, 2020-09-24), .NET
# on Cloud Run europe-west1, the database probably in europe-west2: CROSS-REGION, a same-region call maybe faster.
LOOKUP = RoundTrip(14.5)  # 1 key: 14-21 ms, median ~14.5 (dotnet#5333, cross-region)
RUN_QUERY = RoundTrip(19)  # small result: 14-24 ms, median ~19 (dotnet#5333, cross-region)
COMMIT = RoundTrip(47)  # 1 entity, non-transactional insert: 24-55 ms, median ~47 (dotnet#5333, cross-region)
# INF: one small RPC, as a Lookup (10-20 ms, latency-reference); python-datastore PR#499 (2023-11-28) lets a client skip
# it (begin_later), python-ndb still sends it. No source measures it.
BEGIN_TRANSACTION = LOOKUP
# RunAggregationQuery (COUNT, SUM): no latency figure anywhere; it grows with the index entries scanned. INF: a small
# query's round trip, then SCAN_MS_PER_1000_ENTRIES for each 1,000 entries its COUNT counted (sources: STAND_IN_KNOBS).
RUN_AGGREGATION_QUERY = RUN_QUERY
SCAN_MS_PER_1000_ENTRIES = 5.0
# The multi-region profile's Commit waits for replicas in other regions ("Select a regional location if your application
# is more sensitive to write latency": LINKS_MULTI_REGION_COMMIT), no source measures one. INF: the lower end of
# Megastore's cross-datacenter writes, "100-400 ms" (CIDR 2011). Reads: the nearest replica answers (INF). Not used: a
# multi-region read of 100-120 ms with client artefacts (google-cloud-python#4925, 2018).
MULTI_REGION_COMMIT = RoundTrip(100)

DATASTORE = {
    "Lookup": LOOKUP,
    "RunQuery": RUN_QUERY,
    "RunAggregationQuery": RUN_AGGREGATION_QUERY,
    "BeginTransaction": BEGIN_TRANSACTION,
    "Commit": COMMIT,
    "Rollback": LOOKUP,  # INF: one small RPC; "best-effort" and no figure (Datastore best practices)
    "AllocateIds": LOOKUP,  # INF: one small RPC; sai-pullabhotla/catatumbo#12 (2016): "taking quite a while", no number
    "ReserveIds": LOOKUP,  # INF: as AllocateIds
}
# A batch's size, which no source measures. INF: a round trip plus each key or mutation past the first (STAND_IN_KNOBS).
LOOKUP_MS_PER_KEY = 0.5
COMMIT_MS_PER_MUTATION = 1.0

# One entity's writes: the stand-in makes every client's Commits that write one entity (Firestore in Datastore mode: the
# entity; legacy Datastore: its entity group, the root key) take turns at production's rate after a short burst; one
# whose turn cannot come within ENTITY_TURN_MAX_WAIT_S is answered ABORTED in production's words (STAND_IN_KNOBS).
ENTITY_WRITES_PER_S = 1.0
ENTITY_WRITE_BURST = 3  # INF: "sustained" leaves room for a burst, and no source says how large
ENTITY_TURN_MAX_WAIT_S = 2.0  # INF: no source gives it
CONTENTION = "Too much contention on these datastore entities. Please try again."
# Where the stand-in says, in each answer's gRPC trailing metadata, what it waited (ms) and under which profile.
WAIT_HEADER, PROFILE_HEADER = "x-standin-wait-ms", "x-standin-profile"


# The sources' addresses, as /numbers links them (latency/service.py).
_DOTNET_URL = "https://github.com/googleapis/google-cloud-dotnet/issues/5333"
_MEGASTORE_URL = "https://www.cidrdb.org/cidr2011/Papers/CIDR11_Paper32.pdf"
_BATCH_URLS = ("https://cloud.google.com/datastore/docs/best-practices",
               "https://blog.famzah.net/2014/05/02/google-app-engine-datastore-benchmark/",
               "https://dbaspects.blogspot.com/2010/01/memcache-vs-datastore-on-google-app.html")


@dataclass(frozen=True)
class Knob:
    """One of the stand-in's knobs as /numbers shows it, published or an inference, with its sources; its value is
    this module's, read when asked."""
    name: str  # the figure's name above
    label: str
    unit: str
    published: bool  # False: an inference (INF above)
    source: str
    links: tuple[str, ...]

    @property
    def value(self) -> float:
        return float(globals()[self.name])


STAND_IN_KNOBS = (
    Knob("LOOKUP_MS_PER_KEY", "A Lookup's wait for each key after the first", "ms", False,
         "none published: batching performs \u201cmultiple operations with the same overhead as a single "
         "operation\u201d (Datastore best practices); a get and update of 1,000 entities took ~1.5 s (blog.famzah.net, "
         "2014), split as reads and writes were timed, 20 against 40 ms (dbaspects.blogspot.com, 2010)", _BATCH_URLS),
    Knob("COMMIT_MS_PER_MUTATION", "A Commit's wait for each mutation after the first", "ms", False,
         "none published: as a Lookup's keys, a written entity twice a read one", _BATCH_URLS),
    Knob("SCAN_MS_PER_1000_ENTRIES", "An aggregation's wait for each 1,000 index entries its COUNT counted", "ms",
         False, "none published: Count.up_to bounds \u201cthe number of entities to scan, limiting latency, and "
         "cost\u201d (Datastore v1 API reference), and 1,000 entries are billed as one read (Datastore pricing)",
         ("https://cloud.google.com/ruby/docs/reference/google-cloud-datastore-v1/latest/"
          "Google-Cloud-Datastore-V1-AggregationQuery-Aggregation-Count", "https://cloud.google.com/datastore/pricing",
          "https://github.com/googleapis/python-ndb/issues/360")),
    Knob("ENTITY_WRITES_PER_S", "One entity's sustained writes a second (legacy: its entity group's)", "writes/s",
         True, "Firestore: \u201cyou can't update a single document at an unlimited rate\u201d; \u201cCloud Firestore "
         "has a limit of one sustained write per second, per document\u201d (the Firebase counter extension); legacy: "
         "\u201cabout one commit per second\u201d for an entity group",
         ("https://cloud.google.com/firestore/docs/solutions/counters",
          "https://firebase.google.com/products/extensions/firebase-firestore-counter",
          "https://cloud.google.com/datastore/docs/concepts/structuring_for_strong_consistency")),
    Knob("ENTITY_WRITE_BURST", "One entity's burst: writes it takes at once before the rate applies", "writes", False,
         "none published: Megastore's \u201ca few writes per second per entity group\u201d (Baker et al., CIDR 2011)",
         (_MEGASTORE_URL,)),
    Knob("ENTITY_TURN_MAX_WAIT_S", "Longest a commit waits for its turn at an entity before it is answered ABORTED",
         "s", False, "none published: contention costs seconds (python-ndb backs off from 1 s; nodejs-firestore#827 "
         "logs a 3.9 s backoff after ABORTED; the Firestore emulator's lock timeout is ~2.3 s); the answer in "
         "production's words (Firestore's error codes)",
         ("https://github.com/googleapis/nodejs-firestore/issues/827",
          "https://cloud.google.com/firestore/native/docs/understand-error-codes")),
)
# The figures above that a stand-in may be started with other values of (tests make the bound small): its knobs.
KNOBS = tuple(knob.name for knob in STAND_IN_KNOBS)

# A Memorystore call from App Engine standard, through a Serverless VPC Access connector no source measures. INF:
# about 1 ms at p50, a few ms at p99, capped at 10 ms; Memorystore says only "sub-millisecond" (SOURCE_LINKS).
CACHE = RoundTrip(1.0, ((0.99, 3.0), (0.999, 6.0), (0.9999, 10.0)))
# Cloud Tasks: no published latency. INF: CreateTask stores the task durably in the queue's region, budgeted as a
# Commit; a delivery, the queue's dispatch and an HTTP request through App Engine's front end, as two small round trips.
TASK_CREATE = COMMIT
TASK_DELIVERY = RoundTrip(29)
UNKNOWN_RPC = RUN_QUERY

PROFILE_DATASTORE = {
    "production": DATASTORE,
    "multi-region": {**DATASTORE, "Commit": MULTI_REGION_COMMIT},
}

# The profile the current request last waited under (set by every wait, read by its footer: core/costs.py).
_waited_under: contextvars.ContextVar[str] = contextvars.ContextVar("latency_profile", default="production")


def label() -> str:
    """`LATENCY=<profile>` that this request's modelled waits were drawn from, as the footer names it."""
    return f"LATENCY={_waited_under.get()}"


class Model:
    """The waits of one app's stack: none (the default), or a profile's. The app's processes wait their cache calls
    and Cloud Tasks with it; the stand-in draws Datastore RPCs' round trips from it. One per process, thread-safe."""

    def __init__(self, name: str = "none", seed: int | None = None) -> None:
        if name not in NAMES:
            raise ValueError(f"LATENCY must be one of {', '.join(NAMES)}, not {name!r}")
        self.name = name
        self.on = name != "none"
        self.datastore = PROFILE_DATASTORE.get(name, DATASTORE)
        self._rng = random.Random(seed)  # LATENCY_SEED: the same draws, in the same order, run after run
        self._lock = threading.Lock()  # one generator shared by every thread

    def datastore_round_trip(self, method: str, keys: int = 1, mutations: int = 1) -> float:
        """A Datastore RPC's round trip in seconds, drawn (nothing when off): its method's, plus the server's work for
        each key a Lookup reads and each mutation a Commit writes after the first."""
        if not self.on:
            return 0.0
        with self._lock:
            seconds = self.datastore.get(method, UNKNOWN_RPC).draw(self._rng)
        return seconds + (max(keys - 1, 0) * LOOKUP_MS_PER_KEY + max(mutations - 1, 0) * COMMIT_MS_PER_MUTATION) / 1000

    def scan(self, entries: int) -> float:
        """The seconds an aggregation's scan of `entries` index entries adds to its round trip (nothing when off)."""
        return entries / 1000 * SCAN_MS_PER_1000_ENTRIES / 1000 if self.on else 0.0

    def names_the_request(self) -> None:
        """The current request waits under this profile (its footer names it)."""
        if self.on:
            _waited_under.set(self.name)

    def before_cache_call(self, waits: Waits | None = None) -> float:
        """Wait a cache call's modelled round trip through the connector (nothing when off)."""
        return self._wait(CACHE, waits)

    def before_task_create(self, waits: Waits | None = None) -> float:
        """Wait a Cloud Tasks CreateTask (nothing when off)."""
        return self._wait(TASK_CREATE, waits)

    def before_task_delivery(self, waits: Waits | None = None) -> float:
        """Wait the time from a task's turn in the queue to its request reaching the app (nothing when off)."""
        return self._wait(TASK_DELIVERY, waits)

    def _wait(self, trip: RoundTrip, waits: Waits | None) -> float:
        if not self.on:
            return 0.0
        with self._lock:
            seconds = trip.draw(self._rng)
        self.names_the_request()
        time.sleep(seconds)
        if waits is not None:
            waits.add_wait(seconds)
        return seconds

    def describe(self) -> list[dict]:
        """The model's figures (this profile's, or production's when off), for /numbers and the benchmarks."""
        calls = [*self.datastore.items(), ("cache call (through the VPC connector)", CACHE),
                 ("Cloud Tasks create", TASK_CREATE), ("Cloud Tasks delivery", TASK_DELIVERY)]
        return [{"call": name, "median_ms": round(trip.median_ms, 1), "p99_ms": round(trip.p99_ms, 1),
                 "p999_ms": round(trip.p999_ms, 1), "cap_ms": round(trip.cap_ms, 1), "source": cited(name, trip)[0]}
                for name, trip in calls]


_DOTNET = "google-cloud-dotnet#5333 (2020-09-24, probably cross-region)"
INFERENCE = "an inference"  # how a source that is one says so
_INF = f"none published: {INFERENCE}"
SOURCES = {
    "Lookup": _DOTNET, "RunQuery": _DOTNET, "Commit": _DOTNET, "BeginTransaction": _INF, "Rollback": _INF,
    "AllocateIds": _INF, "ReserveIds": _INF,
    "RunAggregationQuery": f"{_INF}: a RunQuery + {SCAN_MS_PER_1000_ENTRIES:g} ms per 1,000 index entries counted",
    "cache call (through the VPC connector)": f"{_INF} (Memorystore: \u201csub-millisecond\u201d)",
    "Cloud Tasks create": f"{_INF}: a Commit", "Cloud Tasks delivery": f"{_INF}: two small round trips",
}
SOURCES_MULTI_REGION_COMMIT = f"{_INF}: Megastore's 100-400 ms (CIDR 2011)"
TAIL_SOURCE = "the tail: nodejs-firestore#1994 (2024-02-04) GetDocument's histogram of strong reads, its steps scaled"
# Where each of SOURCES is published (none: an inference with no source to link), and the two below.
SOURCE_LINKS = {
    "Lookup": (_DOTNET_URL,), "RunQuery": (_DOTNET_URL,), "Commit": (_DOTNET_URL,),
    "BeginTransaction": ("https://github.com/googleapis/python-datastore/pull/499",),
    "Rollback": ("https://cloud.google.com/datastore/docs/best-practices",),
    "AllocateIds": ("https://github.com/sai-pullabhotla/catatumbo/issues/12",),
    "ReserveIds": ("https://github.com/sai-pullabhotla/catatumbo/issues/12",),
    "RunAggregationQuery": STAND_IN_KNOBS[KNOBS.index("SCAN_MS_PER_1000_ENTRIES")].links,
    "cache call (through the VPC connector)": (
        "https://cloud.google.com/appengine/docs/legacy/standard/python/migrate-to-python3/memcache-to-memorystore",),
    "Cloud Tasks create": (), "Cloud Tasks delivery": (),
}
LINKS_MULTI_REGION_COMMIT = ("https://cloud.google.com/datastore/docs/locations",
                             "https://cloud.google.com/firestore/docs/best-practices", _MEGASTORE_URL)
TAIL_LINKS = ("https://github.com/googleapis/nodejs-firestore/issues/1994",)


def cited(call: str, trip: RoundTrip) -> tuple[str, tuple[str, ...]]:
    """(its source in words, its links) of a call's modelled round trip; an unknown RPC's is a RunQuery's."""
    if trip is MULTI_REGION_COMMIT:
        return SOURCES_MULTI_REGION_COMMIT, LINKS_MULTI_REGION_COMMIT
    call = call if call in SOURCES else "RunQuery"
    return SOURCES[call], SOURCE_LINKS[call]


def tail_steps() -> list[tuple[float, float, float]]:
    """The tail's published steps, the median first: (quantile, the histogram's ms there, that / its median)."""
    return [(1 - 2 ** -k, ms, ms / _STRONG_READ_MS[0]) for k, ms in enumerate(_STRONG_READ_MS, start=1)]


# The benchmarks' "Whose figures" paragraph and /numbers name these.
SUMMARY = (
    "Lookup 14.5 ms, RunQuery 19 ms and Commit 47 ms at the median (google-cloud-dotnet#5333, Jon Skeet, 2020-09-24, "
    ".NET on Cloud Run, probably cross-region), each with the tail of nodejs-firestore#1994's GetDocument histogram "
    "(2024-02-04, Cloud Shell, strong reads; its step above p99.9 5.1x the median, its last step, 78x, the cap); "
    "under LATENCY=multi-region a Commit's median is 100 ms (an inference: Megastore's cross-datacenter writes, CIDR "
    "2011). A Lookup grows 0.5 ms a key and a Commit 1 ms a mutation after the first, and one entity takes 1 write "
    "a second after a burst of 3 (Firestore's \u201cone sustained write per second, per document\u201d; legacy: "
    "about one commit a second per entity group), waiting at most 2 s for its turn. No source measures "
    "BeginTransaction, Rollback, AllocateIds, RunAggregationQuery (modelled as a RunQuery + 5 ms per 1,000 index "
    "entries counted), a batch's size, the burst, the bound on a turn, a cache call through the Serverless VPC "
    "Access connector (1 ms, p99 3 ms) or Cloud Tasks (create: a Commit; delivery: 29 ms): those are inferences.")


OFF = Model()  # the model off: what a stack built without one waits (nothing)


def seed_from(env: Mapping[str, str]) -> int | None:
    """LATENCY_SEED, when set: the seed of a run's draws, so that the run can be repeated (None: a fresh seed)."""
    seed = env.get("LATENCY_SEED")
    return int(seed) if seed else None
