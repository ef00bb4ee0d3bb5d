"""Tests written after `make mutants`' trial on comments/bookmarks.py and mapper/handback.py (docs/mutants.md,
"Survivors"): the bookmark type test, the second hand-back's 0 and the lease with children kill survivors; the failed
hand-back's error and end time, and the record made for a task handed back before its first chunk, pin at once what
the trial's mutants there were caught by only through slow timeouts or not at all (mutmut made no mutant of them)."""
import datetime

import pytest
from google.cloud import ndb

from blog import service as blog_service
from blog.models import EntryRef
from comments import bookmarks, service
from core import clock, runtime
from core.errors import BadInput
from mapper.task import TaskPayload, TaskRecord
from mapper.unvisited import end_unvisited


def _user(name):
    return {"id": f"dev-{name}", "email": f"{name}@example.com"}


@pytest.mark.parametrize("bookmark", [20260101, 1.5, ["20260101T000000.000000Z|u|0000000001"], {"id": 1}, b"x"])
def test_a_bookmark_that_is_not_a_string_is_a_400(ndb_context, bookmark):
    """A bookmark of any other type than a string (a JSON number, a list) is a 400 like a malformed one, never a
    TypeError out of the id pattern (a 500)."""
    blog_service.post_entry("b", "entry", "body", "boss@example.com")
    service.post_comment(EntryRef("b", 0), _user("u"), "hello")
    assert bookmarks.comment_key(bookmark) is None
    for kw in ({"after": bookmark}, {"before": bookmark}):
        with pytest.raises(BadInput):
            service.get_comments(EntryRef("b", 0), **kw)


def _running(task="0", weight=12, children=()):
    """A running task's record, as its first chunk left it: `children` the payloads it split into."""
    payload = TaskPayload("job1", task, None, None, weight)
    record = TaskRecord.new(ndb.Key(TaskRecord, payload.name), payload)
    record.children = [{**c.to_json(), "keys": None, "keys_apart": False} for c in children]
    record.put()
    return record.key, payload


def test_a_record_handed_back_twice_returns_its_weight_once(ndb_context):
    """The hand-back that ends a record returns the weight the task kept for its page; any later one (a retry, a
    redelivery) returns 0 and leaves the record as the first left it, so the job's weights still sum exactly."""
    key, payload = _running(weight=12)
    record, returned = end_unvisited(key, payload, "done")
    assert (returned, record.state, record.returned) == (12, "done", 12)
    record, again = end_unvisited(key, payload, "failed", "late")
    assert again == 0
    stored = key.get()
    assert (stored.state, stored.returned, stored.error) == ("done", 12, None)


def test_a_failed_hand_back_stores_its_error_and_when_it_ended(ndb_context):
    """A task that failed for good keeps its error on its record (the job's page shows it) and the time it ended (the
    timeline's bar ends there)."""
    key, payload = _running()
    before = clock.now()
    end_unvisited(key, payload, "failed", "RuntimeError: boom")
    stored = key.get()
    assert (stored.state, stored.error) == ("failed", "RuntimeError: boom")
    assert stored.updated is not None and stored.updated >= before


def test_an_ended_record_keeps_a_lease_only_while_it_has_children_for_the_sweep(ndb_context, task_queue):
    """Handed back with children, a record keeps the lease the settings give (the sweep checks its children until
    they end) and its children are enqueued; with none, it keeps no lease. The weight returned is what the children
    did not take."""
    child = TaskPayload("job1", "0-0", None, None, 5)
    key, payload = _running(weight=12, children=[child])
    before = clock.now()
    record, returned = end_unvisited(key, payload, "done")
    seconds = runtime.current().settings.mapper_lease_seconds
    assert returned == 7 and key.get().returned == 7
    lease = key.get().lease
    assert lease is not None and before + datetime.timedelta(seconds=seconds) <= lease
    assert lease <= clock.now() + datetime.timedelta(seconds=seconds)
    assert [task.name for task in task_queue.queue.pending] == [child.queue_name]
    alone, alone_payload = _running(task="1", weight=3)
    end_unvisited(alone, alone_payload, "done")
    assert alone.get().lease is None


def test_a_task_handed_back_before_its_first_chunk_gets_its_record(ndb_context):
    """A task cancelled before any chunk committed has no record yet: handing it back makes one, under the task's own
    key, ended, with the payload's job and weight, and returns that weight."""
    payload = TaskPayload("job1", "0-3", None, None, 9)
    key = ndb.Key(TaskRecord, payload.name)
    record, returned = end_unvisited(key, payload, "done")
    assert returned == 9 and record.key == key
    stored = key.get()
    assert (stored.job, stored.weight, stored.state, stored.returned) == ("job1", 9, "done", 9)
