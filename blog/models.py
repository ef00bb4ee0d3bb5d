"""Blog entities: one entity group per blog.

An entry must get the next index of its blog, dense and unique however many admins post at once. Datastore has no
auto-increment and no row count, so each blog has a BlogIndex entity holding the highest index given out, and a post
reads it, bumps it and writes the entry in one transaction. A transaction is atomic within entity groups, so the
entries are children of their BlogIndex: the bump and the entry commit together or not at all, and an ancestor query
over the blog is strongly consistent. The price is one entity group per blog, about one post per second sustained,
which is plenty for a blog (comments, written by many, do not live in this group: see comments/).
"""
from dataclasses import dataclass

from google.cloud import ndb


class BlogIndex(ndb.Model):
    """A blog; key name is the blog's name. `max_index` is the highest entry index given out (the talk's name).

    Read by key on every front-page view, written once per post: the ndb global cache serves it from memcached. Its
    value is also the version of the blog's cached front page (blog/service.py), so it must never be read stale from
    there: ndb locks its cache entry before the post commits and its readers fill the cache only by compare-and-swap.
    No in-context cache, so a long-lived context (a thread, a task) sees other processes' posts.
    """
    _use_cache = False
    max_index = ndb.IntegerProperty(required=True, indexed=False)
    created = ndb.DateTimeProperty(auto_now_add=True, indexed=False)

    @property
    def name(self) -> str:
        return self.key.id()


class BlogEntry(ndb.Model):
    """An entry; child of its BlogIndex, key name "<blog>:<index>" (EntryRef.key), so a permalink is a get by key.

    `index` is the only indexed property: pages are `index <= start ORDER BY index DESC` within the blog (an ancestor
    query, with its composite index in index.yaml). `body_html` is rendered and sanitized once, when the entry is
    written, not on every view.
    """
    index = ndb.IntegerProperty(required=True)
    title = ndb.TextProperty(required=True)
    body = ndb.TextProperty(required=True)
    body_html = ndb.TextProperty(required=True)
    author = ndb.TextProperty(required=True)  # the display name (core.identity.display_name), never an email
    created = ndb.DateTimeProperty(auto_now_add=True, indexed=False)


@dataclass(frozen=True, order=True)
class EntryRef:
    """One entry's identity, and the only code that spells its names. Every feature that refers to an entry holds one
    (blog/service.py's `entry_ref` checks a blog and index from outside and makes it).

    The spellings are each fixed by data already stored, so they stay as they are: the BlogEntry key name
    "<blog>:<index>", the reference other entities store ("<blog>/<index>", the shape of its URL), and the stem of its
    counters' names ("<blog>.<index>", counter names allow no ':' or '/').
    """
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


class PostMarker(ndb.Model):
    """A post request that has been applied; child of the BlogIndex, key name the request's idempotency key.

    Written in the post's transaction, so it exists exactly when the entry does. A retry of the same request (the
    client's, or ours after a commit whose outcome was UNKNOWN) finds it and answers with the entry already written
    instead of spending a second index. Read only inside that transaction, so not in the global cache.
    """
    _use_global_cache = False
    index = ndb.IntegerProperty(required=True, indexed=False)
    call = ndb.TextProperty(required=True)  # the stamp: the id of the Call that wrote it (core/transactions.py)
    created = ndb.DateTimeProperty(auto_now_add=True, indexed=False)
