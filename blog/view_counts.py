"""Each entry's page views, on an adaptive sharded counter of its own (lesson 1's), kept off the public counters."""
from blog import entries
from blog.models import EntryRef
from counters import service as counters

COUNTERS = counters.owned("blog")


def views_counter(ref: EntryRef) -> str:
    """The full name of an entry's page-view counter, for the page to show."""
    return COUNTERS.name(ref.counter_name("views"))


def record_view(ref: EntryRef) -> int:
    """Count a view of an existing entry (best effort: a view that cannot be counted costs the reader nothing); the
    total afterwards, cached, so it may trail a little. Sent as a POST by the entry page's script: a GET never writes
    (prefetchers, crawlers and retries repeat GETs), and only entries that exist get a counter."""
    entries.require_entry(ref)
    COUNTERS.increment(ref.counter_name("views"))
    return view_count(ref)


def view_count(ref: EntryRef) -> int:
    short = ref.counter_name("views")
    return COUNTERS.totals([short])[short]
