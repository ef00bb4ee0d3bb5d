"""core.exactly_once.once, the exactly-once protocol every caller goes through (docs/lessons/exactly-once.md)."""
import ast
from pathlib import Path

import pytest
from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core.exactly_once import ANOTHERS, MINE, WROTE, Call, Written, once
from tests.support import commit_answers_unknown

ROOT = Path(__file__).resolve().parent.parent
APP_PACKAGES = ("accounts", "appstats", "blog", "comments", "core", "counters", "latency", "mapper", "planner", "tour")


class Effect(ndb.Model):
    _use_cache = False
    _use_global_cache = False
    stamp = ndb.TextProperty()


def _effect_once(key: ndb.Key, followed: list, call: Call | None = None):
    def look():
        found = key.get(retries=0)
        return Written(found.stamp, "written before") if found else None

    def write(_, stamp):
        Effect(key=key, stamp=stamp).put()
        return "written now"
    return once(look, write, then=followed.append, call=call)


def test_nothing_written_writes_with_the_stamp_and_then_follows(ndb_context):
    """The first call writes the effect with its own stamp and runs what follows the commit."""
    followed, key = [], ndb.Key(Effect, "a")
    call = Call()
    done = _effect_once(key, followed, call)
    assert (done.found, done.value, done.wrote, done.by_another) == (WROTE, "written now", True, False)
    assert key.get().stamp == call.id and followed == ["written now"]


def test_another_calls_effect_is_answered_and_nothing_follows(ndb_context):
    """A second call finds the first's stamp: ANOTHERS, nothing written again, and `then` does not run (the first
    call ran its own)."""
    key, first = ndb.Key(Effect, "b"), Call()
    _effect_once(key, [], first)
    followed = []
    done = _effect_once(key, followed)
    assert (done.found, done.value, done.by_another) == (ANOTHERS, "written before", True)
    assert followed == [] and key.get().stamp == first.id  # not written again


def test_an_effect_written_without_a_stamp_is_anothers_never_nothing_written(ndb_context):
    """Written or not is the effect's question, never the stamp's: an effect with no stamp is another's."""
    key = ndb.Key(Effect, "c")
    Effect(key=key).put()
    followed = []
    done = _effect_once(key, followed)
    assert done.found == ANOTHERS and followed == [] and key.get().stamp is None


@pytest.mark.parametrize("error", [core_exceptions.Unknown("lost"), core_exceptions.DeadlineExceeded("late"),
                                   core_exceptions.ServiceUnavailable("dropped")])
def test_a_commit_that_answered_an_error_yet_applied_is_mine_and_still_followed(ndb_context, monkeypatch, error):
    """The commit applied and its answer was lost: the retry, the same call, finds its own stamp (MINE), writes
    nothing again, and runs what follows the commit once."""
    real, answered = ndb.transaction, []

    def applied_then_lost(fn, **options):
        result = real(fn, **options)
        if not answered:
            answered.append(result)
            raise error
        return result
    monkeypatch.setattr(ndb, "transaction", applied_then_lost)
    followed, call = [], Call()
    done = _effect_once(ndb.Key(Effect, "d"), followed, call)
    monkeypatch.undo()
    assert answered and (done.found, done.value) == (MINE, "written before")
    assert followed == ["written before"] and ndb.Key(Effect, "d").get().stamp == call.id


def test_the_support_helper_names_a_once_by_its_write(ndb_context, monkeypatch):
    """tests.support.commit_answers_unknown finds a `once`'s transaction by the name of its write."""
    answered = commit_answers_unknown(monkeypatch, "_effect_once.<locals>.write")
    assert _effect_once(ndb.Key(Effect, "e"), []).found == MINE and answered


def test_no_caller_compares_a_stamp():
    """Which of the three is `once`'s to say: outside core/exactly_once.py no app module compares a stamp (an
    `applied(` call, or `==` against a `.call`, a `*_by` field or a Call's `.id`)."""
    found = []
    for package in APP_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "core" / "exactly_once.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "applied":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} applied(")
                if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
                    for side in [node.left, *node.comparators]:
                        name = getattr(side, "attr", "")
                        if name == "call" or name.endswith("_by") or (name == "id" and "call" in ast.unparse(side)):
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert found == []
