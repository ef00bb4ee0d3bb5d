"""The tour: one live figure per lesson, read the way each lesson teaches (cached totals, gets by key, one query),
and the lessons' source files, readable in the browser."""
import functools
from dataclasses import dataclass
from pathlib import Path

from blog import service as blog
from comments import service as comments
from counters import service as counters
from mapper import service as mapper

REPO = Path(__file__).resolve().parent.parent
TOUR_COUNTER = "likes"  # the adaptive demo counter: its shards show the lesson


@dataclass
class Lesson:
    slug: str
    title: str
    sources: tuple


LESSONS = {lesson.slug: lesson for lesson in (
    Lesson("counters", "1. Sharded counters", ("counters/service.py", "counters/models.py")),
    Lesson("blog", "2. A blog paged by index", ("blog/service.py", "blog/models.py")),
    Lesson("comments", "3. Comments by composite key", ("comments/service.py", "comments/models.py")),
    Lesson("mapper", "4. Adaptive sharding: a mapper", ("mapper/service.py", "mapper/keyrange.py")),
)}

# Files a visitor may read at /source/<path>: found once per process, and only these (a fixed list, so no path a
# visitor types can reach anything else).
SOURCES = frozenset(
    str(p.relative_to(REPO)) for folder in ("core", "counters", "blog", "comments", "mapper", "accounts", "latency",
                                            "tour")
    for p in sorted((REPO / folder).glob("*.py")) if p.name != "__init__.py"
) | {"index.yaml", "app.yaml", "queue.yaml", "main.py"}


def figures():
    """{lesson slug: its live figure}; None for a lesson with nothing to show yet (no demo content)."""
    index = blog.get_blog(blog.DEMO_BLOG)  # one get by key: the index entity knows how many entries there are
    return {"counters": _counter(), "blog": _blog(index), "comments": _comments(index), "mapper": _last_job()}


def _counter():
    config = counters.get_config(TOUR_COUNTER)
    if config is None:
        return None
    total = counters.get_total(TOUR_COUNTER, config)
    return {"name": TOUR_COUNTER, "count": total.count, "num_shards": config.num_shards, "cached": total.cached}


def _blog(index):
    return None if index is None else {"blog": blog.DEMO_BLOG, "entries": index.max_index + 1,
                                        "newest": index.max_index}


def _comments(index):
    """Comments on the demo blog's front page: its entries' comment counters, cached totals in one round trip."""
    if index is None:
        return None
    newest = range(index.max_index, max(-1, index.max_index - blog.PAGE_SIZE), -1)
    counts = comments.comment_counts(blog.DEMO_BLOG, list(newest))
    busiest = max(counts, key=lambda i: (counts[i], i))
    return {"blog": blog.DEMO_BLOG, "total": sum(counts.values()), "entries": len(counts), "busiest": busiest,
            "busiest_count": counts[busiest]}


def _last_job():
    jobs = mapper.list_jobs(limit=1)
    return mapper.job_dict(jobs[0]) if jobs else None


def read_source(path):
    """The text of one of SOURCES, or None."""
    return _read(path) if path in SOURCES else None


@functools.cache  # only ever called with one of SOURCES, so the cache stays as small as that list
def _read(path):
    # Once per process: the deployed files do not change.
    return (REPO / path).read_text(encoding="utf-8")
