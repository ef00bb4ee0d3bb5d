"""Comment entities: one entity group per commenting user (its UserSequence), none per entry, so that no user's post
waits on another's (a group takes about one commit a second); their order is the sort key `time|user|sequence`
(service.sort_key). Why: docs/lessons/comments.md.
"""
from google.cloud import ndb

from core.markers import ExpiringMarker


class UserSequence(ndb.Model):
    """A user's comment sequence; key name is the user's pseudonym (core.people.pseudonym: the key is in every
    comment's public id, so it must not say who wrote it). Written only by that user's own posts; read in
    transactions only, so in neither cache (the global one would make every comment wait on memcached)."""
    _use_cache = False
    _use_global_cache = False
    seq = ndb.IntegerProperty(default=0, indexed=False)


class CommentMarker(ExpiringMarker):
    """A comment that has been applied (core/idempotency.py): a child of its author's UserSequence, key name the
    marker name of the author's Idempotency-Key (or the posting call's id), its answer the comment's id. Written in the
    comment's transaction, so that a retry finds it; read only there."""
    _use_cache = False
    _use_global_cache = False


class Comment(ndb.Model):
    """A comment; child of its author's UserSequence. One value, five names: its id ("id" in service.comment_dict) =
    key name = `sort_key` (made by service.sort_key()) = a page's after/before bookmark, so a bookmark is a get by key.

    Listing an entry's comments is a query across users' groups (`entry` equal, ordered by `sort_key`, both directions
    declared in index.yaml): on legacy Datastore eventually consistent (Firestore's is strong), which is why
    service.get_comments adds the reader's own newest comments by key. The key path starts with the author, so key
    order is not comment order: hence `sort_key`. Not in the global cache: posting must not depend on memcached."""
    _use_global_cache = False  # and comments are read by query, which no cache serves
    entry = ndb.StringProperty(required=True)  # "<blog>/<index>"
    sort_key = ndb.StringProperty(required=True)
    text = ndb.TextProperty(required=True)
    author = ndb.TextProperty(required=True)  # the name shown: the part of the email before the '@'
    created = ndb.DateTimeProperty(required=True, indexed=False)
