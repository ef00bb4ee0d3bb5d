"""The tour: one live figure per lesson, each read the way its lesson teaches (cached totals, gets by key, one query),
and the app's source files, readable in the browser. It knows the lessons only through the features' registry
(core/features.py): it imports no feature."""
import functools

from core.features import REPO


def figures(lessons):
    """{lesson slug: its live figure}; None for a lesson with nothing to show yet (no demo content)."""
    return {slug: lesson.figure() for slug, lesson in lessons.items()}


def read_source(path, sources):
    """The text of `path` if it is one of `sources` (the registry's fixed set), else None."""
    return _read(path) if path in sources else None


@functools.cache  # only ever called with one of the registry's sources, so the cache stays as small as that set
def _read(path):
    # Once per process: the deployed files do not change.
    return (REPO / path).read_text(encoding="utf-8")
