"""Blog entities: one entity group per blog, so that a post's index bump and its entry commit together and an
ancestor query over the blog is strongly consistent. The price, about one post a second per blog, is plenty for a blog
(comments, written by many, live elsewhere: see comments/). Why: docs/lessons/blog.md."""
from dataclasses import dataclass

from google.cloud import ndb

from core.markers import ExpiringMarker


class BlogIndex(ndb.Model):
    """The blog itself, named after its index as in the talk (BlogIndex is the blog; an entry's `index` is its number,
    where "composite index" and "index scan" are Datastore's): key name the blog's name, parent of its entries;
    `max_index` is the highest entry index given out, and the version of its cached front page. Read by key on every
    page view, so in ndb's global cache (never stale: docs/lessons/blog.md#why-the-front-pages-key-names-max_index);
    not in the in-context cache, so a long-lived context (a thread, a task) sees other processes' posts."""
    _use_cache = False
    max_index = ndb.IntegerProperty(required=True, indexed=False)
    created = ndb.DateTimeProperty(auto_now_add=True, indexed=False)

    @property
    def name(self) -> str:
        return self.key.id()


class BlogEntry(ndb.Model):
    """An entry; child of its BlogIndex, key name "<blog>:<index>" (EntryRef.key), so a permalink is a get by key.
    `index` is its only indexed property (pages query it); `body_html` is rendered and sanitized once, when written."""
    index = ndb.IntegerProperty(required=True)
    title = ndb.TextProperty(required=True)
    body = ndb.TextProperty(required=True)
    body_html = ndb.TextProperty(required=True)
    author = ndb.TextProperty(required=True)  # the display name (core.people.display_name), never an email
    created = ndb.DateTimeProperty(auto_now_add=True, indexed=False)


@dataclass(frozen=True, order=True)
class EntryRef:
    """One entry's identity, and the only code that spells its names (`entry_ref` in blog/service.py makes one from a
    URL). Each spelling is fixed by data already stored: the key name "<blog>:<index>", the reference other entities
    store ("<blog>/<index>"), the stem of its counters' names ("<blog>.<index>": no ':' or '/' in a counter name)."""
    blog: str
    index: int

    @property
    def key(self) -> ndb.Key:
        return ndb.Key(BlogIndex, self.blog, BlogEntry, f"{self.blog}:{self.index}")

    @classmethod
    def from_key(cls, key: ndb.Key) -> "EntryRef":
        blog, _, index = key.id().rpartition(":")
        return cls(blog, int(index))

    @property
    def path(self) -> str:
        """What another entity stores to point at this entry (an indexed string: a query can match it)."""
        return f"{self.blog}/{self.index}"

    def counter_name(self, suffix: str | None = None) -> str:
        """The short name of one of the entry's counters, under its owner's prefix (counters.owned)."""
        return f"{self.blog}.{self.index}" + (f".{suffix}" if suffix else "")


class PostMarker(ExpiringMarker):
    """A post that has been applied (core/idempotency.py): key name the marker name of the caller's Idempotency-Key
    (or the call's id), its answer the entry's index. Written in the post's transaction: a retry (the client's, or ours
    after an UNKNOWN commit) finds it and answers with the entry instead of spending a second index. A root, not the
    blog's child: named by the caller and the key only, it is found when the key is sent to another blog (a 409).
    Read only in that transaction: not globally cached."""
    _use_global_cache = False
