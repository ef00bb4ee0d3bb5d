"""The comments' repair job (lesson 4's mapper): set every entry's comment counter to the number of its comments.
A comment is counted after its commit, best effort (service.count_comment), so a count can drift; this mends it."""
from typing import Any

from google.cloud import ndb

from blog.models import EntryRef
from comments.models import Comment
from comments.service import COUNTERS, comments_counter
from mapper import jobs as mapper_jobs


def _prepare(entry_keys: list[ndb.Key], params: dict[str, Any]) -> dict[ndb.Key, int]:
    """How far each entry's counter is from its comments. Counting is a query on Comment.entry, which no transaction
    may run (only ancestor queries can), so it runs here, before the chunk's transaction applies the differences. On
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


def _apply(entries: list[ndb.Model], params: dict[str, Any], deltas: dict[ndb.Key, int]) -> list[ndb.Model]:
    writes: list[ndb.Model] = []
    for entry in entries:
        if entry.key in deltas:
            writes += COUNTERS.add_in_transaction(comments_counter(EntryRef.from_key(entry.key)), deltas[entry.key])
    return writes


RECOUNT = mapper_jobs.JobDefinition(
    name="recount_comments", kind="BlogEntry", title="Recount comment counters",
    description="Sets every entry's comment counter to the number of its comments (counts are best effort: a process "
                "that dies between a comment and its +1 leaves the counter one short). Exact when nobody comments "
                "meanwhile.",
    apply=_apply, prepare=_prepare,
    # Legacy's 25 entity groups a transaction: the task's record, each entry's blog (a chunk may span as many blogs as
    # entries), and each repaired counter's config and shard: 1 + 8 + 2 * 8 = 25.
    per_transaction=8, page_size=50)
