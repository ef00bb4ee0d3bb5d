"""What a page of comments needs beside its query (comments/service.py's get_comments): the bookmark it starts from,
checked, and the reader's own latest comments, read by key and merged in."""
import re
from collections.abc import Iterable

from google.cloud import ndb

from blog.models import EntryRef
from comments.models import Comment, UserSequence
from core.errors import BadInput

# service.sort_key's `time|user|seq`; the user part names a UserSequence key, so never one Datastore reserves (__...__)
ID_PATTERN = re.compile(r"(\d{8}T\d{6}\.\d{6}Z)\|((?!__)[^|\s]{1,200})\|(\d{10})")


def comment_key(comment_id: object) -> ndb.Key | None:
    """The comment's key, from its id alone (the author's group is in it); None when it is not a well-formed id."""
    match = ID_PATTERN.fullmatch(comment_id) if isinstance(comment_id, str) else None
    if match is None:
        return None
    return ndb.Key(UserSequence, match.group(2), Comment, comment_id)


def checked(comment_id: object, ref: EntryRef, field: str) -> str | None:
    """`comment_id` as a page's bookmark (None for none): the id of a comment on this entry, well formed and existing
    (a get by key, strongly consistent). Anything else is a 400, never an empty or wrong page."""
    if comment_id is None:
        return None
    key = comment_key(comment_id)
    comment = key.get() if key is not None else None
    if key is None or comment is None or comment.entry != ref.path:
        raise BadInput(f"{field} is not a comment of this entry.", f"bad_{field}")
    return key.id()


def with_own(shown: list[Comment], own: Iterable[str], ref: EntryRef, owns_after: str | None,
             owns_before: str | None) -> list[Comment]:
    """`shown` plus the reader's own comments (ids in `own`) on this entry in the page's span (`owns_after`,
    `owns_before`: None, no bound), read by key (strongly consistent, unlike the page's query), by `sort_key`."""
    have = {c.sort_key for c in shown}
    keys = [k for k in map(comment_key, own or ()) if k is not None and k.id() not in have]
    if not keys:
        return shown
    mine = [c for c in ndb.get_multi(keys) if c is not None and c.entry == ref.path
            and (owns_after is None or c.sort_key > owns_after) and (owns_before is None or c.sort_key < owns_before)]
    return sorted(shown + mine, key=lambda c: c.sort_key) if mine else shown
