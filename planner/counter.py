"""A counter written so many times a second at peak: the shards it needs, what an increment and a total read cost,
and when the adaptive counter (counters/growth.py) would reach that size."""
import math

from core import billing
from core.costs import plural
from counters.growth import ContentionWindow
from counters.models import ADAPTIVE_MAX_SHARDS, MAX_SHARDS
from planner import figures
from planner.figures import Plan, calls_in_turn, priced, sustained_rate

# What an increment sends, by backend: on Firestore a blind server-side increment (one Commit, no read); on legacy a
# transaction that reads its shard (counters/writes.py).
INCREMENT_RPCS = {"firestore": {"Commit": 1}, "legacy": figures.TRANSACTION}


def adaptive_growth(shards: int, attempts_per_second: float) -> tuple[int, int, float]:
    """(the adaptive counter's size at or above `shards`, windows of attempts it takes from one shard, seconds at
    `attempts_per_second`) if every window's collisions ask for a doubling (counters/growth.py ContentionWindow: a
    window of min(WINDOW, ATTEMPTS_PER_SHARD x shards) attempts; more collisions grow it faster)."""
    size, windows, attempts = 1, 0, 0
    while size < min(shards, ADAPTIVE_MAX_SHARDS):  # at most log2(ADAPTIVE_MAX_SHARDS) steps
        attempts += min(ContentionWindow.WINDOW, ContentionWindow.ATTEMPTS_PER_SHARD * size)
        size, windows = size * 2, windows + 1
    return min(size, ADAPTIVE_MAX_SHARDS), windows, attempts / attempts_per_second


def plan_counter(writes_per_second: int, peak_seconds: int, backend: str = "firestore",
                 profile: str = "production") -> Plan:
    """A counter written `writes_per_second` at peak for `peak_seconds`: the shards it needs, what an increment and a
    total read cost, and when the adaptive counter would reach that size."""
    plan = Plan("counter", {"writes_per_second": writes_per_second, "peak_seconds": peak_seconds,
                            "backend": backend, "profile": profile})
    plan.figure("peak writes a second", writes_per_second, "writes/s", "yours", "")
    plan.figure("peak lasts", peak_seconds, "s", "yours", "")
    rate = sustained_rate(plan)
    shards = math.ceil(writes_per_second / rate)
    plan.line(f"shards = ceil({writes_per_second} writes/s / {rate:g} write/s an entity) = {shards}")
    plan.answer("shards", "Shards needed (production's guidance)", shards,
                f"{shards} shards" + ("" if shards <= MAX_SHARDS else
                                      f": more than one counter here may have ({MAX_SHARDS}); split it"))
    plan.figure("most shards a counter may have", MAX_SHARDS, "shards", "app", "counters/models.py MAX_SHARDS")

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
    peak = writes_per_second * peak_seconds
    peak_usd = usd * peak / 1_000_000
    plan.line(f"the peak: {writes_per_second} x {peak_seconds} s = {peak:,} increments = ${peak_usd:,.2f}")
    plan.answer("peak_usd", "The whole peak's increments, USD", round(peak_usd, 2), f"${peak_usd:,.2f}")

    cached_median, _ = calls_in_turn(plan, {}, 1, profile, "a total from the cache (one get)")
    read_median, _ = calls_in_turn(plan, {"Lookup": 1}, 1, profile,
                                   f"a total on a miss (get_multi of the {shards} shard keys, then the cache add)")
    read_usd = priced(plan, billing.Billed(reads=shards), f"a total read on a miss ({shards} shards)")
    plan.answer("total_read", "A total read on a cache miss, USD a million", round(read_usd, 2),
                f"{shards} reads, {read_median:.1f} ms, ${read_usd:.2f} a million (from the cache: "
                f"{cached_median:.1f} ms, nothing billed)")

    size, windows, seconds = adaptive_growth(shards, writes_per_second)
    plan.figure("adaptive counter's most shards", ADAPTIVE_MAX_SHARDS, "shards", "app",
                "counters/models.py ADAPTIVE_MAX_SHARDS")
    plan.figure("contention window, attempts", ContentionWindow.WINDOW, "attempts", "app", "counters/growth.py")
    plan.figure("window per shard, attempts", ContentionWindow.ATTEMPTS_PER_SHARD, "attempts", "app",
                "counters/growth.py")
    plan.line(f"adaptive: from 1 shard, doubling after each window of min({ContentionWindow.WINDOW}, "
              f"{ContentionWindow.ATTEMPTS_PER_SHARD} x shards) attempts that collide: {windows} windows to "
              f"{size} shards, {seconds:.1f} s at {writes_per_second} attempts/s (a process's own attempts)")
    text = f"{size} shards after {windows} windows, about {seconds:.1f} s into the peak"
    reached: float | None = round(seconds, 1)
    if shards > ADAPTIVE_MAX_SHARDS:
        text, reached = f"never: it stops at {ADAPTIVE_MAX_SHARDS} shards; give it a general counter of {shards}", None
    elif backend == "firestore":
        text += " (on Firestore its blind increments never collide on the emulator: give it fixed shards)"
    plan.answer("adaptive_seconds", "When the adaptive counter reaches that size, s", reached, text)
    return plan
