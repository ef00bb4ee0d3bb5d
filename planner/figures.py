"""What every planner shares: a `Plan` (its figures, each saying whose it is; its answers; its arithmetic as lines a
person can follow), the model's round trips added up in turn, the bill priced. Every figure is imported from where
the app keeps it, never copied.
"""
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import billing, production_latency
from core.tables import markdown_tables

# About one sustained write a second to one entity, on both backends: the latency model's figure, with its sources.
SUSTAINED_WRITES = next(k for k in production_latency.STAND_IN_KNOBS if k.name == "ENTITY_WRITES_PER_S")

# What each of the app's writes sends, by backend: on Firestore an increment is a blind server-side increment (one
# Commit, no read); on legacy a transaction that reads its shard (counters/writes.py). A transaction on one entity
# group holds it from its Lookup to its Commit: the writes to it follow one another.
TRANSACTION = {"BeginTransaction": 1, "Lookup": 1, "Commit": 1}
INCREMENT_BILL = {"firestore": billing.Billed(writes=1), "legacy": billing.Billed(reads=1, writes=1)}
BACKENDS = ("firestore", "legacy")
PROFILES = production_latency.PROFILES

WHOSE = {
    "yours": "your input",
    "record": "the recorded request's (its /appstats record)",
    "production": "production's (Google's guidance or bill)",
    "model": "the latency model's (a published measurement)",
    "inference": "the latency model's (an inference: no source measures it)",
    "app": "this app's code",
    "bench": "this machine's benchmark (bench/results)",
}


# A rate in the unit its person thinks in (50 posts a minute, not 0.83 a second); the planners divide by seconds.
PER = {"second": 1, "minute": 60, "hour": 3600}
PER_SHORT = {"second": "s", "minute": "min", "hour": "h"}


@dataclass(frozen=True)
class Rate:
    """So many a second, a minute or an hour."""
    count: int
    per: str = "second"

    @property
    def per_second(self) -> float:
        return self.count / PER[self.per]

    def of(self, noun: str) -> str:
        """'50 posts a minute', '1 post an hour'."""
        return f"{self.count:,} {noun}{'' if self.count == 1 else 's'} {'an' if self.per == 'hour' else 'a'} {self.per}"

    def as_input(self, name: str) -> dict[str, int]:
        """The rate as the inputs gave it: {"posts_per_minute": 50}."""
        return {f"{name}_per_{self.per}": self.count}


def a_unit(value: float, unit: str) -> str:
    """`unit` as it reads after `value`: "1 write/s", "1 entity", "2 writes/s" (ms, s, USD as they are)."""
    noun, slash, rest = unit.partition("/")
    if value != 1 or noun in ("ms", "s", "USD") or not noun.endswith("s"):
        return unit
    return (noun[:-3] + "y" if noun.endswith("ies") else noun[:-1]) + slash + rest


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    whose: str  # a key of WHOSE
    source: str  # a link, a file of this app, or the model's source in words


@dataclass(frozen=True)
class Answer:
    name: str
    label: str
    value: float | None  # None: no such figure (an adaptive counter that never reaches the size asked)
    text: str


@dataclass
class Plan:
    planner: str
    inputs: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    arithmetic: list[str] = field(default_factory=list)

    def figure(self, name: str, value: float, unit: str, whose: str, source: str) -> float:
        """`value`, listed among the plan's figures once however often the arithmetic uses it."""
        figure = Figure(name, value, a_unit(value, unit), whose, source)
        if figure not in self.figures:
            self.figures.append(figure)
        return value

    def answer(self, name: str, label: str, value: float | None, text: str) -> None:
        self.answers.append(Answer(name, label, value, text))

    def line(self, text: str) -> None:
        self.arithmetic.append(text)

    def rate(self, name: str, rate: Rate, noun: str) -> float:
        """Your `rate` of `noun` among the figures as you gave it (50 posts/min), per second for the arithmetic."""
        self.figure(name, rate.count, f"{noun}/{PER_SHORT[rate.per]}", "yours", "")
        return rate.per_second

    def as_dict(self) -> dict[str, Any]:
        plan = dataclasses.asdict(self)
        for figure in plan["figures"]:
            figure["whose_label"] = WHOSE[figure["whose"]]
        return plan


# --- the model's round trips -----------------------------------------------------------------------------------------

def round_trip(method: str, profile: str) -> production_latency.RoundTrip:
    """The model's round trip of a Datastore RPC (or "cache") under `profile`."""
    if method == "cache":
        return production_latency.CACHE
    return production_latency.PROFILE_DATASTORE[profile].get(method, production_latency.UNKNOWN_RPC)


def calls_in_turn(plan: Plan, rpcs: dict[str, int], cache_calls: int, profile: str, what: str) -> tuple[float, float]:
    """(median ms, p99 ms) of `rpcs` and `cache_calls` made one after another, each figure added to `plan`: the
    medians summed (the model's typical wait), and every call at its p99 (a bound on a slow request)."""
    median = p99 = 0.0
    terms = []
    for method, n in [*rpcs.items(), ("cache", cache_calls)]:
        if not n:
            continue
        trip = round_trip(method, profile)
        call = "cache call (through the VPC connector)" if method == "cache" else method
        source, _ = production_latency.cited(call, trip)  # the model's published measurement, or an inference
        whose = "inference" if "inference" in source else "model"
        plan.figure(f"{method} round trip, median", trip.median_ms, "ms", whose, source)
        plan.figure(f"{method} round trip, p99", round(trip.p99_ms, 1), "ms", whose, production_latency.TAIL_SOURCE)
        median += n * trip.median_ms
        p99 += n * trip.p99_ms
        terms.append(f"{n} x {method} {trip.median_ms:g} ms (p99 {trip.p99_ms:.1f})")
        if method == "RunAggregationQuery":  # the model adds a wait per entry counted, which no input here says
            plan.figure("an aggregation's wait per 1,000 index entries counted",
                        production_latency.SCAN_MS_PER_1000_ENTRIES, "ms", "inference",
                        production_latency.SOURCES["RunAggregationQuery"])
            terms.append(f"{production_latency.SCAN_MS_PER_1000_ENTRIES:g} ms per 1,000 entries each counts (not "
                         "counted here: at least)")
    plan.line(f"{what}: " + (" + ".join(terms) or "no calls") + f" = {median:.1f} ms at the medians, "
              f"{p99:.1f} ms if each waited its p99")
    return median, p99


def sustained_rate(plan: Plan) -> float:
    """SUSTAINED_WRITES, listed among `plan`'s figures with the backend's source."""
    firestore, _, legacy = SUSTAINED_WRITES.links  # Firestore's counters page, Firebase's extension, legacy's page
    return plan.figure("sustained writes a second to one entity", SUSTAINED_WRITES.value, "writes/s", "production",
                       legacy if plan.inputs.get("backend") == "legacy" else firestore)


def priced(plan: Plan, billed: billing.Billed, what: str, once: bool = False,
           answer: tuple[str, str] | None = None) -> float:
    """`billed` priced a million times (`once`: one time, for a job), the prices among `plan`'s figures; `answer`:
    the (name, label) of the answer that states it."""
    for kind, n in (("reads", billed.reads), ("writes", billed.writes), ("deletes", billed.deletes)):
        if n:
            plan.figure(f"price of 100,000 {kind}", billing.USD_PER_100K[kind], "USD", "production",
                        f"{billing.PRICES_SOURCE} ({billing.PRICES_LOCATION}, read {billing.PRICES_READ_ON})")
    usd = billed.usd_per_million() / (1_000_000 if once else 1)
    text = f"{billed.describe()}: ${usd:.4f} a job" if once else billed.priced()
    plan.line(f"{what}: {text}")
    if answer:
        plan.answer(*answer, round(usd, 4 if once else 2), text)
    return usd


# --- this machine's benchmarks ---------------------------------------------------------------------------------------

def bench_tables(path: Path) -> tuple[str, dict[tuple[str, str], list[dict[str, str]]]]:
    """(the date it ran, {(backend, profile): its table's rows}) of a benchmark's results under the model's profiles;
    ("", {}) where the file is absent (bench/ is not deployed)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "", {}
    date = re.search(r"\d{4}-\d{2}-\d{2}", text)
    found = {}
    for heading, rows in markdown_tables(text).items():
        profile = heading.partition("LATENCY=")[2]
        if profile and date:
            found[("firestore" if heading.startswith("Firestore") else "legacy", profile)] = rows
    return (date[0] if date else ""), found
