"""A counter written so many times a second at peak: the shards it needs, what an increment and a total read cost,
and when the adaptive counter (counters/growth.py) would reach that size."""
import functools
import math
from dataclasses import dataclass
from pathlib import Path

from core import billing, production_latency
from core.costs import plural
from core.features import REPO
from counters.growth import ContentionWindow
from counters.models import ADAPTIVE_MAX_SHARDS, MAX_SHARDS
from planner import figures
from planner.figures import Plan, Rate, a_unit, bench_tables, calls_in_turn, priced, sustained_rate

INCREMENT_RPCS = {"firestore": {"Commit": 1}, "legacy": figures.TRANSACTION}

# One shard's rate as this machine's counters benchmark measured it (absent where bench/ is not deployed): its
# `ceiling` row, where each writer has a one-shard counter of its own, so each entity is written as fast as the
# stand-in lets one entity be written. Not its `single` row (32 writers on one shard), which measures contention.
COUNTERS_RESULTS = REPO / "bench" / "results" / "counters.md"
ONE_SHARD = "ceiling"


@dataclass(frozen=True)
class Measured:
    per_shard: float  # increments committed a second
    writers: int
    date: str  # when the benchmark ran


@functools.cache
def measured_per_shard(path: Path) -> dict[tuple[str, str], Measured]:
    """{(backend, profile): one shard's rate as the benchmark at `path` measured it}, read once per process."""
    date, tables = bench_tables(path)
    found = {}
    for key, rows in tables.items():
        row = next((row for row in rows if row.get("variant") == ONE_SHARD), None)
        if row:
            writers = int(row["writers"])
            found[key] = Measured(float(row["commits/s"]) / writers, writers, date)
    return found


def adaptive_growth(shards: int, attempts_per_second: float) -> tuple[int, int, float]:
    """(the adaptive counter's size at or above `shards`, windows of attempts it takes from one shard, seconds at
    `attempts_per_second`) if every window's collisions ask for a doubling (counters/growth.py ContentionWindow: a
    window of min(WINDOW, ATTEMPTS_PER_SHARD x shards) attempts; more collisions grow it faster)."""
    size, windows, attempts = 1, 0, 0
    while size < min(shards, ADAPTIVE_MAX_SHARDS):  # at most log2(ADAPTIVE_MAX_SHARDS) steps
        attempts += min(ContentionWindow.WINDOW, ContentionWindow.ATTEMPTS_PER_SHARD * size)
        size, windows = size * 2, windows + 1
    return min(size, ADAPTIVE_MAX_SHARDS), windows, attempts / attempts_per_second


def plan_counter(writes: Rate, peak_seconds: int, backend: str = "firestore", profile: str = "production") -> Plan:
    """A counter written at the `writes` rate at peak for `peak_seconds` (the module's question)."""
    plan = Plan("counter", {**writes.as_input("writes"), "peak_seconds": peak_seconds, "backend": backend,
                            "profile": profile})
    per_second = plan.rate("peak writes", writes, "writes")
    at_peak = f"{per_second:.4g} {a_unit(per_second, 'writes/s')}"
    plan.figure("peak lasts", peak_seconds, "s", "yours", "")
    rate = sustained_rate(plan)
    shards = math.ceil(per_second / rate)
    plan.line(f"shards = ceil({at_peak} / {rate:g} write/s an entity) = {shards}")
    plan.answer("shards", "Shards needed (production's guidance)", shards,
                plural(shards, "shard") + ("" if shards <= MAX_SHARDS else
                                           f": more than one counter here may have ({MAX_SHARDS}); split it"))
    plan.figure("most shards a counter may have", MAX_SHARDS, "shards", "app", "counters/models.py MAX_SHARDS")
    measured = measured_per_shard(COUNTERS_RESULTS).get((backend, profile))
    if measured is None:
        plan.line(f"one shard as this machine's benchmark measured it: not measured in this deployment "
                  f"({COUNTERS_RESULTS.relative_to(REPO)} is not deployed)")
        plan.answer("bench_shards", "Shards needed (this machine's benchmark)", None,
                    "not measured in this deployment: production's guidance above decides")
    else:
        per_shard = plan.figure("one shard's increments a second, one writer each", round(measured.per_shard, 3),
                                "increments/s", "bench", f"{COUNTERS_RESULTS.relative_to(REPO)}, {measured.date}, "
                                f"LATENCY={profile}, its {ONE_SHARD} row ({measured.writers} one-shard counters, "
                                "one writer each: its commits/s over its writers)")
        bench_shards = math.ceil(per_second / per_shard)
        plan.line(f"shards by this machine's benchmark = ceil({per_second:.4g} / {per_shard:g} increments/s a "
                  f"shard) = {bench_shards}")
        plan.answer("bench_shards", "Shards needed (this machine's benchmark)", bench_shards,
                    f"{plural(bench_shards, 'shard')} at {per_shard:g}/s a shard, measured {measured.date}" +
                    (": the emulator does not hold a shard to production's one write a second; the guidance decides"
                     if bench_shards < shards else ""))

    rpcs = INCREMENT_RPCS[backend]
    median, p99 = calls_in_turn(plan, rpcs, 0, profile, f"one increment on {backend} ({', '.join(rpcs)})")
    plan.answer("increment_rpcs", "An increment's RPCs", sum(rpcs.values()), plural(sum(rpcs.values()), "RPC"))
    plan.answer("increment_ms", "An increment's time, model median", round(median, 1), f"{median:.1f} ms "
                f"(p99 bound {p99:.1f} ms)")
    if backend == "legacy":
        in_turn = 1000 / median
        plan.line(f"one shard's transactions follow one another: 1000 ms / {median:.1f} ms = {in_turn:.1f} "
                  "increments/s a shard at most under the model; production's guidance is the lower figure")
        plan.answer("model_per_shard", "One shard's increments a second in turn, model", round(in_turn, 1),
                    f"{in_turn:.1f}/s")
    usd = priced(plan, figures.INCREMENT_BILL[backend], "an increment is billed")
    plan.answer("increment_usd_per_million", "An increment, USD a million", round(usd, 2), f"${usd:.2f}")
    peak = round(per_second * peak_seconds)
    peak_usd = usd * peak / 1_000_000
    plan.line(f"the peak: {at_peak} x {peak_seconds} s = {plural(peak, 'increment')} = ${peak_usd:,.2f}")
    plan.answer("peak_usd", "The whole peak's increments, USD", round(peak_usd, 2), f"${peak_usd:,.2f}")

    cached_median, _ = calls_in_turn(plan, {}, 1, profile, "a total from the cache (one get)")
    read_median, _ = calls_in_turn(plan, {"Lookup": 1}, 1, profile, f"a total on a miss (get_multi of "
                                   f"{plural(shards, 'shard key')}, then the cache add)")
    read_usd = priced(plan, billing.Billed(reads=shards), f"a total read on a miss ({plural(shards, 'shard')})")
    plan.answer("total_read", "A total read on a cache miss, USD a million", round(read_usd, 2),
                f"{plural(shards, 'read')}, {read_median:.1f} ms, ${read_usd:.2f} a million (from the cache: "
                f"{cached_median:.1f} ms, nothing billed)")

    size, windows, seconds = adaptive_growth(shards, per_second)
    plan.figure("adaptive counter's most shards", ADAPTIVE_MAX_SHARDS, "shards", "app",
                "counters/models.py ADAPTIVE_MAX_SHARDS")
    plan.figure("contention window, attempts", ContentionWindow.WINDOW, "attempts", "app", "counters/growth.py")
    plan.figure("window per shard, attempts", ContentionWindow.ATTEMPTS_PER_SHARD, "attempts", "app",
                "counters/growth.py")
    plan.line(f"adaptive: from 1 shard, doubling after each window of min({ContentionWindow.WINDOW}, "
              f"{ContentionWindow.ATTEMPTS_PER_SHARD} x shards) attempts that collide: {plural(windows, 'window')} to "
              f"{plural(size, 'shard')}, {seconds:.1f} s at {per_second:.4g} {a_unit(per_second, 'attempts/s')} (a "
              "process's own attempts)")
    # One bound on both backends: a shard past its sustained rate is refused (legacy: a transaction aborted; Firestore:
    # a blind increment answered ABORTED for contention once its turn is too far away, as the stand-in answers it), so
    # the adaptive counter's attempts collide, and it grows, until its shards take the writes: the shards above.
    bound = plan.figure("longest a write waits for its turn at an entity", production_latency.ENTITY_TURN_MAX_WAIT_S,
                        "s", "inference", "core/production_latency.py ENTITY_TURN_MAX_WAIT_S")
    plan.line(f"its writers collide while a shard takes more than {rate:g} {a_unit(rate, 'writes/s')}: past that "
              f"{'a transaction' if backend == 'legacy' else 'a blind increment'} waits its turn at the shard and is "
              f"refused for contention once the turn is more than {bound:g} s away, so it grows "
              + (f"until {plural(size, 'shard')} take the {at_peak}" if shards <= ADAPTIVE_MAX_SHARDS else
                 f"to its cap of {ADAPTIVE_MAX_SHARDS} shards, which do not take the {at_peak}"))
    text = f"{plural(size, 'shard')} after {plural(windows, 'window')}, about {seconds:.1f} s into the peak"
    reached: float | None = round(seconds, 1)
    if shards > ADAPTIVE_MAX_SHARDS:
        text, reached = f"never: it stops at {ADAPTIVE_MAX_SHARDS} shards; give it a general counter of {shards}", None
    plan.answer("adaptive_seconds", "When the adaptive counter reaches that size, s", reached, text)
    return plan
