"""Comments: the talk's third lesson, written at a high rate by many users with no shared index to serialize them.

A comment's id, and its place in the order, is the sort key `<UTC time>|<user's pseudonym>|<user's sequence>`:
- the time, zero-padded to a fixed width, so that string order is time order;
- the user's pseudonym (core.identity.pseudonym: letters and digits, never '|'), so the three parts split
  unambiguously;
- the user's own sequence, drawn from the user's UserSequence in the transaction that writes the comment, so two
  comments of one user never share a key even within one microsecond, and no two users' posts ever touch one entity.
Time alone is not unique; time|user is not either (one user, two tabs). All three are.

Pages move both ways by that key: `after=<id>` is `sort_key > id ASC`, `before=<id>` is `sort_key < id DESC`, reversed;
each fetches one more than it shows to know whether there is a further page. Never an offset.
"""
import datetime
import re
import uuid
from collections.abc import Iterable
from typing import Any

from google.cloud import ndb

from blog import service as blog_service
from blog.models import EntryRef
from comments.models import Comment, UserSequence
from core import clock, identity, validate
from core.errors import BadInput, SignInRequired
from core.paging import Page
from core.transactions import transact
from counters import service as counters
from mapper import jobs as mapper_jobs

SEPARATOR = "|"
ID_PATTERN = re.compile(r"(\d{8}T\d{6}\.\d{6}Z)\|([^|\s]{1,200})\|(\d{10})")
TEXT_MAX = 2000
PAGE_SIZE = 20
PAGE_MAX = 100
RECENT_SESSION_KEY = "recent_comments"  # the ids of a person's latest comments, kept in their session cookie
RECENT_KEEP = 5
# The comments' own counters (an entry's comment count): only this feature writes them.
COUNTERS = counters.owned("comments")


def sort_key(when: datetime.datetime, user_id: str, seq: int) -> str:
    if SEPARATOR in user_id:
        raise ValueError("a user id in a sort key cannot contain the separator")
    # Fixed width, spelled out: strftime's %Y does not zero-pad years before 1000 on every platform.
    time = (f"{when.year:04d}{when.month:02d}{when.day:02d}T{when.hour:02d}{when.minute:02d}{when.second:02d}"
            f".{when.microsecond:06d}Z")
    return f"{time}{SEPARATOR}{user_id}{SEPARATOR}{seq:010d}"


def comment_key(comment_id: object) -> ndb.Key | None:
    """The comment's key, from its id alone (the author's group is in it); None when it is not a well-formed id."""
    match = ID_PATTERN.fullmatch(comment_id) if isinstance(comment_id, str) else None
    if match is None:
        return None
    return ndb.Key(UserSequence, match.group(2), Comment, comment_id)


def comments_counter(ref: EntryRef) -> str:
    """The short name of an entry's comment counter (a sharded counter: adaptive, since a lively entry is commented
    on by many at once)."""
    return ref.counter_name()


def comment_dict(comment: Comment) -> dict[str, Any]:
    return {"id": comment.sort_key, "text": comment.text, "author": comment.author,
            "created": clock.iso(comment.created)}


def post_comment(ref: EntryRef, user: identity.User | None, text: object,
                 idempotency_key: str | None = None) -> dict[str, Any]:
    """Write `user`'s comment on the entry `ref` names, then count it.

    The transaction touches only the user's UserSequence and the new comment, both in the user's own entity group:
    nothing another user's comment writes, so comments from many users never contend, and one user's own posts (two
    tabs) take turns at their sequence (`hot_key`). A retry after a commit of unknown outcome finds its token among
    the sequence's `recent`.

    `idempotency_key` (a form's token, or the API's header) makes a resend of one of the user's latest comments a
    no-op that answers with the comment already written.
    """
    if user is None:
        raise SignInRequired("Sign in to comment.")
    blog_service.require_entry(ref)  # the entry exists (404 otherwise)
    text = validate.text(text, "text", TEXT_MAX)
    validate.idempotency_key(idempotency_key)
    pseudonym, author = identity.pseudonym(user), identity.display_name(user["email"])
    seq_key = ndb.Key(UserSequence, pseudonym)
    token = idempotency_key or uuid.uuid4().hex
    call = uuid.uuid4().hex

    def txn() -> tuple[bool, dict[str, Any]]:
        sequence = seq_key.get(retries=0) or UserSequence(key=seq_key)
        for sent, written_key, sent_by in sequence.recent:
            if sent == token:
                # Written already: by this call's own attempt whose commit answered UNKNOWN (it is still to be
                # counted), or by the same request sent before (counted then). Answer with it and write nothing.
                written = ndb.Key(UserSequence, pseudonym, Comment, written_key).get(retries=0)
                return sent_by == call, comment_dict(written)
        sequence.seq += 1
        now = clock.now()
        key_name = sort_key(now, pseudonym, sequence.seq)
        sequence.recent = [*sequence.recent, [token, key_name, call]][-UserSequence.RECENT_REQUESTS:]
        comment = Comment(key=ndb.Key(UserSequence, pseudonym, Comment, key_name), entry=ref.path,
                          sort_key=key_name, text=text, author=author, created=now)
        ndb.put_multi([sequence, comment])
        return True, comment_dict(comment)

    fresh, comment = transact(txn, busy_message="You are commenting very fast; try again.", hot_key=seq_key)
    if fresh:
        count_comment(ref)
    return comment


def count_comment(ref: EntryRef) -> None:
    """+1 on the entry's comment counter, after the comment's own transaction has committed.

    Not in that transaction, on purpose: there, a collision on a counter shard would abort and redo the comment's write
    too, and every comment would span two entity groups (bench/results/comments.md measures both ways). The price is
    that a process dying between the two, or a counter that cannot be written (the cache away when the counter is
    first created), leaves the count one short (and a counter commit that answered UNKNOWN yet applied, one over);
    the comment itself is never lost. Best effort, like a view count; the recount job repairs either."""
    COUNTERS.increment(comments_counter(ref))


def _bookmark(comment_id: object, ref: EntryRef, field: str) -> str:
    """A page marker must be the id of a comment on this entry: well-formed, existing (a get by key, strongly
    consistent) and not another entry's. Anything else is a 400, never an empty or wrong page."""
    key = comment_key(comment_id)
    comment = key.get() if key is not None else None
    if key is None or comment is None or comment.entry != ref.path:
        raise BadInput(f"{field} is not a comment of this entry.", f"bad_{field}")
    return key.id()


def get_comments(ref: EntryRef, after: object = None, before: object = None, limit: object = None, last: bool = False,
                 own: Iterable[str] = ()) -> Page:
    """A page of an entry's comments, oldest first: the first page, the one after `after`, the one before `before`, or
    with `last` the newest page.

    The query spans many users' entity groups, so it is eventually consistent: a comment just written may be missing
    from it for a moment. `own` are the ids of the reader's own latest comments (from the session): those that belong
    on this page are read by key (strongly consistent) and merged in, so a person always sees what they just posted.
    """
    blog_service.require_entry(ref)
    limit = validate.whole_number(limit, "limit", 1, PAGE_MAX, default=PAGE_SIZE)
    if after is not None and before is not None:
        raise BadInput("Give after or before, not both.", "bad_bookmark")
    after_id = _bookmark(after, ref, "after") if after is not None else None
    before_id = _bookmark(before, ref, "before") if before is not None else None
    query = Comment.query(Comment.entry == ref.path)
    if before_id is not None or last:
        if before_id is not None:
            query = query.filter(Comment.sort_key < before_id)
        found = query.order(-Comment.sort_key).fetch(limit + 1)
        shown = list(reversed(found[:limit]))
        more_before, more_after = len(found) > limit, before_id is not None
    else:
        if after_id is not None:
            query = query.filter(Comment.sort_key > after_id)
        found = query.order(Comment.sort_key).fetch(limit + 1)
        shown = found[:limit]
        more_before, more_after = after_id is not None, len(found) > limit
    # The page owns the sort keys between its neighbours': above `after` (or above its own first comment when an older
    # page exists), below `before` (or below its own last one when a newer page exists). The reader's own comments in
    # that span belong on this page.
    low, high = after_id, before_id
    if low is None and shown and more_before:
        low = shown[0].sort_key
    if high is None and shown and more_after:
        high = shown[-1].sort_key
    shown = _merge_own(shown, own, ref, low, high)
    return Page([comment_dict(c) for c in shown],
                next=shown[-1].sort_key if shown and more_after else None,
                prev=shown[0].sort_key if shown and more_before else None)


def _merge_own(shown: list[Comment], own: Iterable[str], ref: EntryRef, low: str | None,
              high: str | None) -> list[Comment]:
    """`shown` plus the reader's own comments (ids in `own`) on this entry strictly between `low` and `high`, read by
    key (strongly consistent), in sort-key order."""
    have = {c.sort_key for c in shown}
    keys = [k for k in map(comment_key, own or ()) if k is not None and k.id() not in have]
    if not keys:
        return shown
    mine = [c for c in ndb.get_multi(keys) if c is not None and c.entry == ref.path
            and (low is None or c.sort_key > low) and (high is None or c.sort_key < high)]
    return sorted(shown + mine, key=lambda c: c.sort_key) if mine else shown


def comment_counts(refs: Iterable[EntryRef]) -> dict[EntryRef, int]:
    """{ref: comment count} for entries, in one cache round trip when their totals are cached."""
    names = {ref: comments_counter(ref) for ref in refs}
    found = COUNTERS.totals(list(names.values()))
    return {ref: found[name] for ref, name in names.items()}


# --- the repair job: recount every entry's comment counter from its comments ----------------------------------------

def _recount_prepare(entry_keys: list[ndb.Key], params: dict[str, Any]) -> dict[ndb.Key, int]:
    """How far each entry's counter is from its comments. Counting is a query on Comment.entry, which no transaction
    may run (only ancestor queries can): so it runs here, before the chunk's transaction applies the differences. On
    legacy Datastore that query is eventually consistent: a comment posted a moment before may be missed, and its
    counter set one short until the next recount (Firestore in Datastore mode is strongly consistent)."""
    refs = {key: EntryRef.from_key(key) for key in entry_keys}
    current = COUNTERS.exact_totals([comments_counter(ref) for ref in refs.values()])
    deltas: dict[ndb.Key, int] = {}
    for key, ref in refs.items():
        actual = len(Comment.query(Comment.entry == ref.path).fetch(keys_only=True))
        counted = current[comments_counter(ref)]
        if actual != counted:
            deltas[key] = actual - counted
    return deltas


def _recount_apply(entries: list[ndb.Model], params: dict[str, Any], deltas: dict[ndb.Key, int]) -> list[ndb.Model]:
    writes: list[ndb.Model] = []
    for entry in entries:
        if entry.key in deltas:
            writes += COUNTERS.add_in_transaction(
                comments_counter(EntryRef.from_key(entry.key)), deltas[entry.key])
    return writes


RECOUNT = mapper_jobs.JobDefinition(
    name="recount_comments", kind="BlogEntry", title="Recount comment counters",
    description="Sets every entry's comment counter to the number of its comments (counts are best effort: a process "
                "that dies between a comment and its +1 leaves the counter one short). Exact when nobody comments "
                "meanwhile.",
    apply=_recount_apply, prepare=_recount_prepare,
    # Legacy's 25 entity groups a transaction: the task's record, each entry's blog (a chunk may span as many blogs as
    # entries), and each repaired counter's config and shard: 1 + 8 + 2 * 8 = 25.
    chunk=8, page_size=50)
