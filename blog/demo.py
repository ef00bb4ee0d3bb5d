"""The blog's demo content for a fresh `make run`, and the live figure of its lesson on the tour."""
from typing import Any

from blog import service

DEMO_BLOG = "demo"
DEMO_ENTRIES = 60
_TOPICS = [
    ("Why a counter is not one entity", "An entity group commits about once a second under sustained load. "
     "A counter that many people bump is split into **shards**; see [the counters](/counters)."),
    ("Pages by index, not by offset", "`fetch(10, offset=5000)` reads and throws away 5,000 rows. A page here is "
     "`index <= start ORDER BY index DESC`, one scan at any depth."),
    ("Caching the front page", "Everyone asks for the same first page. It is cached in memcache under a key that "
     "names the blog's `max_index`, so a new post retires it at once."),
    ("Entity groups and transactions", "A transaction is atomic within entity groups. Entries are children of "
     "their `BlogIndex`, so the index bump and the entry commit together."),
    ("Strong and eventual consistency", "Gets by key and ancestor queries are strongly consistent; other queries "
     "may trail the latest writes for a moment."),
]


def seed() -> bool:
    """A demo blog with enough entries for several pages; does nothing when the blog exists."""
    if service.get_blog(DEMO_BLOG) is not None:
        return False
    for i in range(DEMO_ENTRIES):
        title, text = _TOPICS[i % len(_TOPICS)]
        body = (f"{text}\n\nThis is demo entry number {i}, posted by `flask seed`. Its index was given out by the "
                f"blog's index entity in the same transaction that wrote it.\n\n"
                f"- entry index: **{i}**\n- page: {(DEMO_ENTRIES - 1 - i) // service.PAGE_SIZE + 1} of "
                f"{(DEMO_ENTRIES + service.PAGE_SIZE - 1) // service.PAGE_SIZE}\n\n"
                f"```python\nentries = (BlogEntry.query(ancestor=blog)"
                f"\n           .filter(BlogEntry.index <= {i}).order(-BlogEntry.index).fetch(11))\n```\n")
        service.post_entry(DEMO_BLOG, f"{title} (#{i})", body, "seed")
    return True


def figure() -> dict[str, Any] | None:
    """How many entries the demo blog has: one get by key (its index entity knows); None before it exists."""
    index = service.get_blog(DEMO_BLOG)
    return None if index is None else {"blog": DEMO_BLOG, "entries": index.max_index + 1, "newest": index.max_index}
