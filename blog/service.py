"""The blog, the talk's second lesson: a dense index kept by a transaction, and pages found by that index.

Datastore has no row count and no cheap OFFSET (`fetch(10, offset=5000)` still reads and skips 5,000 rows), so each
entry gets the next index from its blog's BlogIndex in the transaction that writes it, and a page is one index scan at
any depth. The front page, read far more than it changes, is cached under a key that names the blog's `max_index`."""
import json
import zlib
from dataclasses import dataclass
from typing import Any

from google.cloud import ndb

from blog.entries import entry_dict
from blog.markup import render_markdown
from blog.models import BlogEntry, BlogIndex, EntryRef, PostMarker
from blog.validate import validate_blog, validate_body, validate_index, validate_title
from core import idempotency, runtime, validate
from core.errors import Conflict, found
from core.exactly_once import Call, Written, once
from core.paging import Page

PAGE_SIZE = 10
PAGE_MAX = 50
FEED_SIZE = 20
PAGE_LIFETIME = 3600  # seconds; correctness never depends on it (the key is versioned), it only frees memory
ENDPOINT = "blog.post"  # what a post's Idempotency-Key is scoped to, with its caller


@dataclass
class Posted:
    entry: dict[str, Any]
    replayed: bool  # True: the request's idempotency key had posted this entry already; this is its answer again


def post_entry(blog: str, title: object, body: object, author: str, idempotency_key: str | None = None,
               caller: str | None = None) -> Posted:
    """Write an entry with the blog's next index (a blog is created by its first entry). The BlogIndex's bump, the
    entry and a PostMarker (named by the caller's Idempotency-Key, core/idempotency.py, else by the call) commit
    together: indexes dense and unique, each post applied once. Why and how on each emulator:
    docs/lessons/blog.md#why-posts-need-turns-the-two-emulators."""
    validate_blog(blog)
    title, body = validate_title(title), validate_body(body)
    request = idempotency.keyed(idempotency_key, caller, ENDPOINT, blog, {"title": title, "body": body})
    body_html = render_markdown(body)  # before the transaction: CPU work does not belong inside it
    blog_key, call = ndb.Key(BlogIndex, blog), Call()
    # Two entity groups in one transaction (the blog's, and the marker's, a root: blog/models.py says why). Every post
    # writes a marker, key or no key: it holds the call's stamp and commits with the post or not at all, so our own
    # retry after a commit that answered UNKNOWN finds it, and the post happens once.
    marker_key = ndb.Key(PostMarker, request.name if request else call.id)

    def look() -> Written | BlogIndex | None:
        # retries=0: on a collision at the BlogIndex the whole transaction is tried again (`transact`), not this lookup.
        blog_index, marker = ndb.get_multi([blog_key, marker_key], retries=0)
        return idempotency.written(marker, request) or blog_index

    def post(blog_index: BlogIndex | None, stamp: str) -> dict[str, Any]:
        blog_index = blog_index or BlogIndex(key=blog_key, max_index=-1)  # a new blog: its first entry gets index 0
        blog_index.max_index += 1
        index = blog_index.max_index
        entry = BlogEntry(key=EntryRef(blog, index).key, index=index, title=title, body=body,
                          body_html=body_html, author=author)
        ndb.put_multi([blog_index, entry, PostMarker.new(marker_key, request, stamp, {"index": index})])
        return entry_dict(entry)

    # hot_key: this blog's posts take turns across processes (core/hotspots.py); the transaction still decides
    posted = once(look, post, then=lambda entry: _forget_front_pages(blog, entry["index"]), call=call,
                  busy_message="The blog is taking many posts at once; try again.", hot_key=blog_key)
    if posted.wrote:
        return Posted(posted.value, False)
    # written already: by this call, whose commit answered UNKNOWN (MINE), or by the key's first request (a replay)
    return Posted(_posted_entry(blog, posted.value["index"]), posted.by_another)


def query_page(blog_key: ndb.Key, start: int, limit: int) -> tuple[list[BlogEntry], int | None]:
    """The `limit` entries with index <= start, newest first, and the next page's start (None if none): one index scan
    of limit + 1 rows at any depth, never an offset. An ancestor query: strongly consistent (it sees the post that
    just committed), with the composite index (BlogEntry, ancestor, index desc) from index.yaml."""
    rows = (BlogEntry.query(ancestor=blog_key).filter(BlogEntry.index <= start)
            .order(-BlogEntry.index).fetch(limit + 1))
    return rows[:limit], (rows[limit].index if len(rows) > limit else None)


def _page_cache_key(blog: str, max_index: int, limit: int) -> str:
    """The key of a blog's cached front page: it names `max_index`, which every post changes, so no reader is served
    one older than a committed post. The BlogIndex read first is never older than Datastore (ndb's global cache locks
    it before the commit and refills it only by compare-and-swap), and a reader who started before the post can store
    only under the old key, which nobody asks for (docs/lessons/blog.md#why-the-front-pages-key-names-max_index)."""
    return f"blog-page:{blog}:{max_index}:{limit}"


@dataclass
class BlogPage(Page):
    """`items`: entry dicts (index, title, body, body_html, author, created), newest first; `next` the older page's
    `start` (None on the last page), `prev` the newer page's (None on the front page)."""
    max_index: int
    cached: bool


def get_page(blog: str, start: object = None, limit: object = PAGE_SIZE) -> BlogPage:
    """Entries with index <= start, newest first (`start` None or past the newest entry: the front page, the only
    page cached), and where the pages around start: `next`, the older entries' page; `prev`, the newer ones'."""
    blog_index = require_blog(blog)  # by key, strongly consistent: its max_index versions the cached front page
    size = validate.whole_number(limit, "limit", 1, PAGE_MAX, default=PAGE_SIZE)
    top = blog_index.max_index
    first = top if start is None else min(validate_index(start, "start"), top)
    newer = None if first == top else min(first + size, top)  # indexes are dense: no query finds it
    cache = runtime.cache()
    cache_key = _page_cache_key(blog, top, size) if first == top else None  # only the front page is cached
    if cache_key is not None:
        cached = cache.get(cache_key)
        if cached is not None:
            entries, next_start = json.loads(zlib.decompress(cached))
            return BlogPage(entries, next=next_start, prev=newer, max_index=top, cached=True)
    rows, next_start = query_page(blog_index.key, first, size)
    entries = [entry_dict(e) for e in rows]
    if cache_key is not None:
        # Compressed: a page of ten long entries can pass memcached's 1 MB item limit as JSON (and if it still does,
        # the add fails quietly and the page is simply not cached).
        cache.add(cache_key, zlib.compress(json.dumps([entries, next_start]).encode()), expire=PAGE_LIFETIME)
    return BlogPage(entries, next=next_start, prev=newer, max_index=top, cached=False)


# --- what serves it: blogs and entries by key -----------------------------------------------------------------------

def get_blog(blog: object) -> BlogIndex | None:
    return ndb.Key(BlogIndex, validate_blog(blog)).get()


def require_blog(blog: object) -> BlogIndex:
    return found(get_blog(blog), f"There is no blog named {blog!r}.", "no_such_blog")


def entry_ref(blog: object, index: object) -> EntryRef:
    """The reference of entry `index` of `blog` as they come in a URL or a request: 400 when either is malformed
    (whether the entry exists is `entries.require_entry`'s question)."""
    return EntryRef(validate_blog(blog), validate_index(index))


def _forget_front_pages(blog: str, index: int) -> None:
    """After post `index` committed: the front pages cached before it. Not needed for correctness (the new max_index
    already retires their keys), only to free memory."""
    if index > 0:
        for size in (PAGE_SIZE, FEED_SIZE):
            runtime.cache().delete(_page_cache_key(blog, index - 1, size))


def _posted_entry(blog: str, index: int) -> dict[str, Any]:
    """The entry a PostMarker says its request posted (a get by key: strongly consistent); a Conflict if it is gone."""
    entry = EntryRef(blog, index).key.get()
    if entry is None:
        raise Conflict(f"This request posted entry {index} of {blog!r}, which no longer exists.", "posted_entry_gone")
    return entry_dict(entry)
