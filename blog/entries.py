"""Entries and blogs as the pages, the feed and the API show them."""
from typing import Any

from blog.models import BlogEntry, BlogIndex, EntryRef
from core import clock
from core.errors import found


def entry_dict(entry: BlogEntry) -> dict[str, Any]:
    return {"index": entry.index, "title": entry.title, "body": entry.body, "body_html": entry.body_html,
            "author": entry.author, "created": clock.iso(entry.created)}


def list_blogs() -> list[tuple[str, int]]:
    """The first 100 blogs by name, with their entry counts. A kind query: eventually consistent on legacy Datastore
    (a blog created a moment ago may be missing for a moment), strongly consistent on Firestore in Datastore mode."""
    return [(b.name, b.max_index + 1) for b in BlogIndex.query().order(BlogIndex.key).fetch(100)]


def require_entry(ref: EntryRef) -> dict[str, Any]:
    """The entry `ref` names, by key: no query, strongly consistent. NotFound if there is none."""
    return entry_dict(found(ref.key.get(), f"Blog {ref.blog!r} has no entry {ref.index}.", "no_such_entry"))
