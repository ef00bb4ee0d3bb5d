"""Comment entities: one entity group per commenting user, none per entry.

Comments arrive from many users at once. If they took their order from anything shared (a per-entry sequence, the
entry's own group), every comment would be a transaction on that one group, about one commit a second. Instead each
user has a UserSequence, a root entity and so an entity group of its own, and a comment is a child of its author's
UserSequence: a post bumps the user's own sequence and writes the comment in one transaction that no other user's
post ever touches. The order among all comments comes from the sort key `time|user|sequence` (see service.sort_key).
"""
from google.cloud import ndb

from core import idempotency
from core.transactions import Call


class UserSequence(ndb.Model):
    """A user's comment sequence; key name is the user's pseudonym (core.identity.pseudonym: the key is in every
    comment's public id, so it must not say who wrote it). Written only by that user's own posts; read in
    transactions only, so in neither cache (the global one would make every comment wait on memcached).

    `recent`: the user's last RECENT_REQUESTS posts as [comment, written_by]: the comment's id and the id of the
    `Call` that wrote it (its stamp), so that a post's own retry after a commit that answered UNKNOWN finds what it
    wrote, with or without an idempotency key. Several, not one: the user's other tab may post in between
    (docs/lessons/comments.md#a-resend-and-a-retry). A resend with a key finds its CommentMarker instead.
    """
    RECENT_REQUESTS = 8
    _use_cache = False
    _use_global_cache = False
    seq = ndb.IntegerProperty(default=0, indexed=False)
    recent = ndb.JsonProperty(default=[])

    def written_by(self, call: Call) -> str | None:
        """The id of the recent comment `call` itself wrote; None when it wrote none of them."""
        for post in self.recent:
            comment_id, written_by = post[-2:]  # (a sequence written before #72 kept its request first: still read)
            if call.applied(written_by):
                return str(comment_id)
        return None

    def remember(self, comment_id: str, written_by: str) -> None:
        self.recent = [*self.recent, [comment_id, written_by]][-self.RECENT_REQUESTS:]


class CommentMarker(idempotency.Marker):
    """A comment sent with an Idempotency-Key (core/idempotency.py): a child of its author's UserSequence, key name
    the key's marker name, its answer the comment's id. Written in the comment's transaction; read only there."""
    _use_cache = False
    _use_global_cache = False


class Comment(ndb.Model):
    """A comment; child of its author's UserSequence, key name its sort key, so a bookmark is a get by key.

    Listing an entry's comments is a query across users' groups (`entry` equal, ordered by `sort_key`, both directions
    declared in index.yaml): eventually consistent, which is why service.get_comments adds the reader's own newest
    comments by key. The key path starts with the author, so key order is not comment order: hence `sort_key`.
    Not in the global cache: posting must not depend on memcached, and comments are read by query.
    """
    _use_global_cache = False
    entry = ndb.StringProperty(required=True)  # "<blog>/<index>"
    sort_key = ndb.StringProperty(required=True)
    text = ndb.TextProperty(required=True)
    author = ndb.TextProperty(required=True)  # the name shown: the part of the email before the '@'
    created = ndb.DateTimeProperty(required=True, indexed=False)
