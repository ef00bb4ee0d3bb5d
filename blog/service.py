"""The blog: the talk's second lesson, a global index kept by a transaction and pages found by index.

Datastore has no row count and no cheap OFFSET: `fetch(10, offset=5000)` still reads and skips 5,000 index entries,
so page N costs O(N). Each entry therefore carries a dense index given out by its blog's BlogIndex in the transaction
that writes it, and a page is `index <= start ORDER BY index DESC LIMIT n+1`: one index scan of n+1 rows at any depth.
The extra row is not shown; it is the next page's `start`, or its absence says there is none.

The front page is read far more than it changes, and every reader would run the same query: it is cached (memcached
or Redis) under a key that carries the blog's `max_index` (see `_page_cache_key` for why no reader can see an old
front page once a post has committed).
"""
import json
import re
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from google.cloud import ndb

from blog.markup import render_markdown
from blog.models import BlogEntry, BlogIndex, EntryRef, PostMarker
from core import clock, runtime, validate
from core.errors import BadInput, Unprocessable, found
from core.paging import Page
from core.transactions import transact
from counters import service as counters

NAME_PATTERN = re.compile(r"[a-z0-9-]{1,64}")
TITLE_MAX = 200
BODY_MAX = 100_000
PAGE_SIZE = 10
PAGE_MAX = 50
FEED_SIZE = 20
MAX_INDEX = 10 ** 9  # bounds `start` and permalinks; far beyond any blog's entries
PAGE_LIFETIME = 3600  # seconds; correctness never depends on it (the key is versioned), it only frees memory
LIST_LIMIT = 100
# The blog's own counters (an entry's views): only this feature writes them; the public counters API refuses them.
COUNTERS = counters.owned("blog")


@dataclass
class BlogPage(Page):
    """`items`: entry dicts (index, title, body, body_html, author, created), newest first; `next` the older page's
    `start` (None on the last page), `prev` the newer page's (None on the front page)."""
    max_index: int
    cached: bool


@dataclass
class Posted:
    entry: dict[str, Any]
    created: bool  # False: the request's idempotency key had already posted this entry


def validate_blog(name: object) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise BadInput("A blog name is 1 to 64 characters of lowercase letters, digits and '-'.", "bad_blog")
    return name


def validate_index(value: object, field: str = "index") -> int:
    """An entry index from a URL or JSON: a whole number 0..MAX_INDEX."""
    return validate.whole_number(value, field, 0, MAX_INDEX)


def validate_title(value: object) -> str:
    title = validate.text(value, "title", TITLE_MAX, strip=True)
    if "\n" in title or "\r" in title:
        raise Unprocessable("title must be one line.", "bad_title")
    return title


def entry_ref(blog: object, index: object) -> EntryRef:
    """The reference of entry `index` of `blog`, both as they come in a URL or a request: 400 when either is malformed
    (whether the entry exists is `require_entry`'s question)."""
    return EntryRef(validate_blog(blog), validate_index(index))


def entry_dict(entry: BlogEntry) -> dict[str, Any]:
    return {"index": entry.index, "title": entry.title, "body": entry.body, "body_html": entry.body_html,
            "author": entry.author, "created": clock.iso(entry.created)}


def views_counter(ref: EntryRef) -> str:
    """The full name of an entry's page-view counter, for the page to show."""
    return COUNTERS.name(ref.counter_name("views"))


# --- writing --------------------------------------------------------------------------------------------------------

def post_entry(blog: str, title: object, body: object, author: str, idempotency_key: str | None = None) -> Posted:
    """Write an entry with the blog's next index (the blog is created by its first entry).

    The BlogIndex read, its bump and the entry's write are one transaction on the blog's entity group: two posts at
    once cannot both read the same max_index and commit. On legacy Datastore one of them aborts at its commit; on
    Firestore both hold read locks and one is aborted (by the emulator only after its lock timeout); it is retried.
    Either way `hot_key` first makes a blog's posts take turns across processes (core/hotspots.py), so most never
    meet. So indexes are dense (a rejected or failed post consumes none) and unique. Every post writes a PostMarker in
    the same transaction, keyed by the client's Idempotency-Key or by a fresh one: a retry after a commit of unknown
    outcome finds it.
    """
    validate_blog(blog)
    title, body = validate_title(title), validate.text(body, "body", BODY_MAX)
    validate.idempotency_key(idempotency_key)
    body_html = render_markdown(body)  # before the transaction: CPU work does not belong inside it
    blog_key = ndb.Key(BlogIndex, blog)
    marker_key = ndb.Key(PostMarker, idempotency_key or uuid.uuid4().hex, parent=blog_key)
    call = uuid.uuid4().hex  # which call wrote the marker: its own retry after an UNKNOWN commit still says "created"
    cache = runtime.cache()

    def txn() -> Posted:
        # retries=0: ndb would retry a lookup that meets a locked entity with backoff; `transact` retries the whole
        # transaction instead, which is what a collision on the BlogIndex calls for.
        blog_index, marker = ndb.get_multi([blog_key, marker_key], retries=0)
        if marker is not None:  # applied already: by this call's attempt whose commit said UNKNOWN, or a resend
            return Posted(entry_dict(EntryRef(blog, marker.index).key.get(retries=0)), marker.token == call)
        if blog_index is None:
            blog_index = BlogIndex(key=blog_key, max_index=-1)  # a new blog: its first entry gets index 0
        blog_index.max_index += 1
        index = blog_index.max_index
        entry = BlogEntry(key=EntryRef(blog, index).key, index=index, title=title, body=body,
                          body_html=body_html, author=author)
        ndb.put_multi([blog_index, entry, PostMarker(key=marker_key, index=index, token=call)])
        if index > 0:  # the blog had front pages before this post
            def forget_old_front_pages() -> None:
                # Not needed for correctness (the new max_index already retires these keys), only to free memory.
                for size in (PAGE_SIZE, FEED_SIZE):
                    cache.delete(_page_cache_key(blog, index - 1, size))
            ndb.get_context().call_on_commit(forget_old_front_pages)
        return Posted(entry_dict(entry), True)

    return transact(txn, busy_message="The blog is taking many posts at once; try again.", hot_key=blog_key)


# --- reading --------------------------------------------------------------------------------------------------------

def get_blog(blog: object) -> BlogIndex | None:
    return ndb.Key(BlogIndex, validate_blog(blog)).get()


def require_blog(blog: object) -> BlogIndex:
    return found(get_blog(blog), f"There is no blog named {blog!r}.", "no_such_blog")


def require_entry(ref: EntryRef) -> dict[str, Any]:
    """The entry `ref` names, by key: no query, strongly consistent. NotFound if there is none."""
    return entry_dict(found(ref.key.get(), f"Blog {ref.blog!r} has no entry {ref.index}.", "no_such_entry"))


def _page_cache_key(blog: str, max_index: int, limit: int) -> str:
    """The key of a blog's cached front page: it names the blog's max_index, the version of its content.

    Deleting a cached page when a post commits is not enough on its own: a reader that queried just before the commit
    can store its old page just after the delete, and it would then be served until it expires. Here a post changes
    the key instead. Every reader first reads the BlogIndex (a get by key: strongly consistent, and served by
    ndb's global cache, which ndb locks before the commit and refills only by compare-and-swap, so it is
    never older than Datastore). A reader who starts after the post's commit therefore sees the new max_index, misses
    on the new key and queries; a slow reader who started before can only store under the old key, which nobody asks
    for any more. Old keys fall away by LRU or PAGE_LIFETIME.
    """
    return f"blog-page:{blog}:{max_index}:{limit}"


def query_page(blog_key: ndb.Key, start: int, limit: int) -> tuple[list[BlogEntry], int | None]:
    """The `limit` entries with index <= start, newest first, and the next page's start (None if none): one index scan
    of limit + 1 rows at any depth. An ancestor query: strongly consistent (it sees the post that just committed), with
    the composite index (BlogEntry, ancestor, index desc) from index.yaml. Never an offset."""
    rows = (BlogEntry.query(ancestor=blog_key).filter(BlogEntry.index <= start)
            .order(-BlogEntry.index).fetch(limit + 1))
    return rows[:limit], (rows[limit].index if len(rows) > limit else None)


def get_page(blog: str, start: object = None, limit: object = PAGE_SIZE) -> BlogPage:
    """Entries with index <= start, newest first (`start` None or past the newest entry: the front page, the only
    page cached), and the markers of the pages around."""
    blog_index = require_blog(blog)
    size = validate.whole_number(limit, "limit", 1, PAGE_MAX, default=PAGE_SIZE)
    top = blog_index.max_index
    first = top if start is None else min(validate_index(start, "start"), top)
    newer = None if first == top else min(first + size, top)
    cache = runtime.cache()
    key = _page_cache_key(blog, top, size) if first == top else None  # only the front page is cached
    if key is not None:
        cached = cache.get(key)
        if cached is not None:
            entries, next_start = json.loads(zlib.decompress(cached))
            return BlogPage(entries, next=next_start, prev=newer, max_index=top, cached=True)
    rows, next_start = query_page(blog_index.key, first, size)
    entries = [entry_dict(e) for e in rows]
    if key is not None:
        # Compressed: a page of ten long entries can pass memcached's 1 MB item limit as JSON (and if it still does,
        # the add fails quietly and the page is simply not cached).
        cache.add(key, zlib.compress(json.dumps([entries, next_start]).encode()), expire=PAGE_LIFETIME)
    return BlogPage(entries, next=next_start, prev=newer, max_index=top, cached=False)


def list_blogs(limit: int = LIST_LIMIT) -> list[tuple[str, int]]:
    """The blogs by name, with their entry counts. A kind query: eventually consistent on legacy Datastore (a blog
    created a moment ago may be missing for a moment), strongly consistent on Firestore in Datastore mode."""
    return [(b.name, b.max_index + 1) for b in BlogIndex.query().order(BlogIndex.key).fetch(limit)]


def record_view(ref: EntryRef) -> int:
    """Count a view of an existing entry on its sharded counter (best effort: a view that cannot be counted must not
    cost the reader anything); the total afterwards, cached, so it may trail a little. A POST of its own, sent by the
    entry page's script, not part of the page's GET: a GET never writes (prefetchers, crawlers and retries repeat
    GETs freely), and only entries that exist get a counter."""
    require_entry(ref)
    COUNTERS.increment(ref.counter_name("views"))
    return view_count(ref)


def view_count(ref: EntryRef) -> int:
    short = ref.counter_name("views")
    return COUNTERS.totals([short])[short]
