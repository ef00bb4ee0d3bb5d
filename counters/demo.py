"""The counters' demo: content for a fresh `make run`, an admin's burst of increments (contention on demand), and the
live figure of their lesson on the tour."""
import secrets
from typing import Any

from core import clock, runtime, validate
from counters import growth, service, simple, totals
from counters.models import CounterConfig

TOUR_COUNTER = "likes"  # the adaptive demo counter: its shards show the lesson
BURST_MAX_WRITERS = 32
BURST_MAX_INCREMENTS = 500


def seed() -> bool:
    if CounterConfig.query(CounterConfig.listed == True).get(keys_only=True) is not None:  # noqa: E712 - ndb filter
        return False
    growth.configure("page-views", "general")
    growth.configure(TOUR_COUNTER, "adaptive")
    growth.configure("downloads", "general", 8)
    for name, times in (("page-views", 120), ("downloads", 25)):
        for _ in range(times):
            service.increment(name)
    # Concurrent, so the adaptive counter has (almost surely) grown by the time anyone looks.
    burst(TOUR_COUNTER, 32, 320)
    for _ in range(30):
        simple.increment()
    return True


def figure() -> dict[str, Any] | None:
    config = growth.get_config(TOUR_COUNTER)
    if config is None:
        return None
    total = totals.get_total(TOUR_COUNTER, config)
    return {"name": TOUR_COUNTER, "count": total.count, "num_shards": config.num_shards, "cached": total.cached}


def burst(name: str, writers: object, increments: object) -> tuple[int, int, int]:
    """`increments` increments of counter `name` from `writers` threads at once: (increments, attempts, num_shards)."""
    writers = validate.whole_number(writers, "writers", 1, BURST_MAX_WRITERS, from_json=True)
    increments = validate.whole_number(increments, "increments", 1, BURST_MAX_INCREMENTS, from_json=True)
    growth.require_config(name)
    shares = [increments // writers + (1 if i < increments % writers else 0) for i in range(writers)]
    batches = runtime.current().map_in_threads(
        lambda count: [service.increment(name).attempts for _ in range(count)], shares)
    attempts = [a for batch in batches for a in batch]
    return len(attempts), sum(attempts), growth.require_config(name).num_shards


def new_burst_name() -> str:
    """A fresh name for burst_new_adaptive, chosen when the page is drawn: its script watches the counter of that
    name grow while the burst runs, so it must know the name before the burst starts."""
    return f"burst-{clock.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def burst_new_adaptive(name: str | None = None, writers: int = 16, increments: int = 200) -> tuple[str, int, int, int]:
    """A new adaptive counter (`name`, or a fresh one), burst at once: the lesson out of the box, where the seeded
    one has grown already. Returns (its name, increments, attempts, num_shards afterwards)."""
    name = name or new_burst_name()
    growth.configure(name, "adaptive")
    return (name, *burst(name, writers, increments))
