"""Comments, the talk's third lesson: many users write at once with nothing shared to serialize them, and yet pages
come in posting order (docs/lessons/comments.md).

A comment's id, and its place in the order, is `<UTC time>|<user's pseudonym>|<user's sequence>`, the time by the
posting server's clock (so "posting order" is as good as the servers' clocks agree): time alone is not unique, nor
time|user (one user, two tabs); all three are. The sequence is the user's own, in their own entity group, so no two
users' comments ever touch one entity. Pages move both ways by that sort key, never an offset."""
import datetime
from collections.abc import Iterable
from typing import Any

from google.cloud import ndb

from blog import entries
from blog.models import EntryRef
from comments import bookmarks
from comments.models import Comment, CommentMarker, UserSequence
from core import clock, idempotency, people, validate
from core.errors import BadInput, Conflict, SignInRequired
from core.exactly_once import Call, Written, once
from core.paging import Page
from counters import service as counters

SEPARATOR = "|"
TEXT_MAX = 2000
PAGE_SIZE = 20
PAGE_MAX = 100
COUNTERS = counters.owned("comments")  # the comments' own counters (an entry's comment count): only they write them
ENDPOINT = "comments.post"  # what a comment's Idempotency-Key is scoped to, with its caller


def sort_key(when: datetime.datetime, pseudonym: str, seq: int) -> str:
    """A comment's id, unique and in posting order: `<time>|<user>|<user's sequence>`."""
    if SEPARATOR in pseudonym:
        raise ValueError("a pseudonym in a sort key cannot contain the separator")
    # Fixed width, spelled out, so that string order is time order: strftime's %Y does not zero-pad years before
    # 1000 on every platform.
    time = (f"{when.year:04d}{when.month:02d}{when.day:02d}T{when.hour:02d}{when.minute:02d}{when.second:02d}"
            f".{when.microsecond:06d}Z")
    return f"{time}{SEPARATOR}{pseudonym}{SEPARATOR}{seq:010d}"


def post_comment(ref: EntryRef, user: people.User | None, text: object,
                 idempotency_key: str | None = None) -> dict[str, Any]:
    """Post `user`'s comment on the entry `ref` names, exactly once, then count it; the comment (`commented`)."""
    return commented(ref, user, text, idempotency_key)[0]


def commented(ref: EntryRef, user: people.User | None, text: object,
              idempotency_key: str | None = None) -> tuple[dict[str, Any], bool]:
    """Write `user`'s comment on the entry `ref` names, then count it: (the comment, replayed). `idempotency_key` (the
    user's own, core/idempotency.py): a resend answers the first send's comment, replayed; other text or entry, 409."""
    if user is None:
        raise SignInRequired("Sign in to comment.")
    entries.require_entry(ref)  # the entry exists (404 otherwise)
    text = validate.text(text, "text", TEXT_MAX)
    request = idempotency.keyed(idempotency_key, user["id"], ENDPOINT, ref.path, {"text": text})
    pseudonym, author = people.pseudonym(user), people.display_name(user["email"])
    seq_key, call = ndb.Key(UserSequence, pseudonym), Call()
    # Only the user's own entity group (sequence, comment, marker, the marker a child of the sequence): users never
    # contend; their tabs take turns. One key names one comment whatever the entry (another entry's same key: 409).
    marker_key = ndb.Key(UserSequence, pseudonym, CommentMarker, request.name if request else call.id)

    def look() -> Written | UserSequence | None:
        sequence, marker = ndb.get_multi([seq_key, marker_key], retries=0)
        return idempotency.written(marker, request) or sequence

    def post(sequence: UserSequence | None, stamp: str) -> dict[str, Any]:
        sequence = sequence or UserSequence(key=seq_key)
        sequence.seq, now = sequence.seq + 1, clock.now()
        key_name = sort_key(now, pseudonym, sequence.seq)
        comment = Comment(key=ndb.Key(UserSequence, pseudonym, Comment, key_name), entry=ref.path,
                          sort_key=key_name, text=text, author=author, created=now)
        ndb.put_multi([sequence, comment, CommentMarker.new(marker_key, request, stamp, {"id": key_name})])
        return comment_dict(comment)

    # Counted once, after this call's commit (WROTE, or MINE: UNKNOWN yet applied); ANOTHERS: by its first send.
    posted = once(look, post, then=lambda _: count_comment(ref), call=call,
                  busy_message="You are commenting very fast; try again.", hot_key=seq_key)
    if posted.wrote:
        return posted.value, False
    written = ndb.Key(UserSequence, pseudonym, Comment, posted.value["id"]).get()
    if written is None:  # deleted since (no page deletes a comment; the console can): not posted again
        raise Conflict("This comment was sent before and has been removed since.", "comment_removed")
    return comment_dict(written), posted.by_another


def get_comments(ref: EntryRef, after: object = None, before: object = None, limit: object = None, last: bool = False,
                 own: Iterable[str] = ()) -> Page:
    """A page of an entry's comments, oldest first: the first, the one after `after`, the one before `before`, or with
    `last` the newest; each fetches one more than it shows, to know whether there is a further page. `own`: the ids of
    the reader's latest comments (their session's last five: views.py's RECENT_SESSION_KEY), read by key and merged
    in, so a person sees what they just posted: legacy Datastore's query across users' groups is eventually consistent
    and may miss them (Firestore in Datastore mode, App Engine's today, is strong: there the merge is a safety net).
    A page owns the sort keys between its neighbours' pages and takes the own comments there: after=X, showing A..T,
    more after: it owns (X, T) (owns_after=X, owns_before=T); an own comment past T is the next page's (after=T)."""
    entries.require_entry(ref)
    limit = validate.whole_number(limit, "limit", 1, PAGE_MAX, default=PAGE_SIZE)
    if after is not None and before is not None:
        raise BadInput("Give after or before, not both.", "bad_bookmark")
    after_id, before_id = bookmarks.checked(after, ref, "after"), bookmarks.checked(before, ref, "before")
    query = Comment.query(Comment.entry == ref.path)
    if before_id is not None or last:  # backwards: `sort_key < before DESC`, shown reversed
        if before_id is not None:
            query = query.filter(Comment.sort_key < before_id)
        found = query.order(-Comment.sort_key).fetch(limit + 1)
        shown = list(reversed(found[:limit]))
        more_before, more_after = len(found) > limit, before_id is not None  # it came back from a later page
    else:  # forwards: `sort_key > after ASC`
        if after_id is not None:
            query = query.filter(Comment.sort_key > after_id)
        found = query.order(Comment.sort_key).fetch(limit + 1)
        shown = found[:limit]
        more_before, more_after = after_id is not None, len(found) > limit  # it came on from an earlier page
    owns_after = after_id or (shown[0].sort_key if shown and more_before else None)  # None: no bound
    owns_before = before_id or (shown[-1].sort_key if shown and more_after else None)
    shown = bookmarks.with_own(shown, own, ref, owns_after, owns_before)
    return Page([comment_dict(c) for c in shown],
                next=shown[-1].sort_key if shown and more_after else None,
                prev=shown[0].sort_key if shown and more_before else None)


def count_comment(ref: EntryRef) -> None:
    """+1 on the entry's comment counter, after the comment's own transaction: best effort, repaired by the recount
    job (docs/lessons/comments.md#the-count-after-the-commit)."""
    COUNTERS.increment(comments_counter(ref))


def comments_counter(ref: EntryRef) -> str:
    """The short name of an entry's comment counter (an adaptive one: a lively entry is commented on by many)."""
    return ref.counter_name()


def comment_counts(refs: Iterable[EntryRef]) -> dict[EntryRef, int]:
    """{ref: comment count} for entries, in one cache round trip when their totals are cached."""
    names = {ref: comments_counter(ref) for ref in refs}
    found = COUNTERS.totals(list(names.values()))
    return {ref: found[name] for ref, name in names.items()}


def comment_dict(comment: Comment) -> dict[str, Any]:
    return {"id": comment.sort_key, "text": comment.text, "author": comment.author,
            "created": clock.iso(comment.created)}
