"""The counters' demo content for a fresh `make run`, and the live figure of their lesson on the tour."""
from counters import service
from counters.models import CounterConfig

TOUR_COUNTER = "likes"  # the adaptive demo counter: its shards show the lesson


def seed():
    """Demo counters; does nothing when any counter exists."""
    if CounterConfig.query(CounterConfig.listed == True).get(keys_only=True) is not None:  # noqa: E712 - ndb filter
        return False
    service.configure("page-views", "general")
    service.configure(TOUR_COUNTER, "adaptive")
    service.configure("downloads", "general", 8)
    for name, times in (("page-views", 120), ("downloads", 25)):
        for _ in range(times):
            service.increment(name)
    # Concurrent, so the adaptive counter has (almost surely) grown by the time anyone looks.
    service.burst(TOUR_COUNTER, 32, 320)
    for _ in range(30):
        service.increment_simple()
    return True


def figure():
    """The adaptive demo counter's cached total and its number of shards; None before it exists."""
    config = service.get_config(TOUR_COUNTER)
    if config is None:
        return None
    total = service.get_total(TOUR_COUNTER, config)
    return {"name": TOUR_COUNTER, "count": total.count, "num_shards": config.num_shards, "cached": total.cached}
