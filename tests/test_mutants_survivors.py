"""Tests written after `make mutants` (docs/mutants.md, "Survivors"): each pins a behaviour that one of mutmut's
mutants changed while every test that reached its function still passed. Each says the guarantee it keeps."""
import pytest
from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from blog import service as blog_service
from blog.models import EntryRef
from core import identity, runtime, transactions
from core.errors import Conflict


def test_an_increment_of_the_simple_counter_that_met_no_one_took_one_attempt(client):
    """The talk's counter answers how many attempts its increment took (the API's `attempts`, the lesson's measure of
    contention): a lone writer's is 1, so a higher figure always means it met another writer."""
    for _ in range(2):
        assert client.post("/api/simple-counter/increment").get_json() == {"applied": True, "attempts": 1}
    assert client.get("/api/simple-counter").get_json()["count"] == 2


def test_an_increment_of_the_simple_counter_that_collides_every_time_is_a_503_that_names_the_counter(
        client, monkeypatch):
    """A shard so hot that every commit collides (Datastore answering ABORTED to each) ends in a 503 that says the
    counter is busy, after `transact`'s tries (no waits here), and counts nothing."""
    tries = []

    def collides(fn, **options):
        tries.append(1)
        raise core_exceptions.Aborted("too much contention on these datastore entities")
    monkeypatch.setattr(ndb, "transaction", collides)
    monkeypatch.setattr(transactions, "backoff", lambda attempt, base, cap: None)
    r = client.post("/api/simple-counter/increment")
    assert r.status_code == 503
    assert r.get_json()["error"] == {"code": "contention", "message": "The counter is very busy; try again."}
    assert len(tries) == 30
    monkeypatch.undo()
    assert client.get("/api/simple-counter?shards=1").get_json()["count"] == 0


def test_a_resend_whose_posted_entry_is_gone_says_which_entry(ndb_context):
    """The 409 for a resend whose entry was deleted since names the entry its first send posted, so the client knows
    what it is told is gone."""
    blog_service.post_entry("b", "t", "body", "boss@example.com", "req-1", "u1")
    EntryRef("b", 0).key.delete()
    with pytest.raises(Conflict) as refused:
        blog_service.post_entry("b", "t", "body", "boss@example.com", "req-1", "u1")
    assert refused.value.message == "This request posted entry 0 of 'b', which no longer exists."


def test_signing_out_ends_the_sign_in_for_the_rest_of_the_request_too(app):
    """After `sign_out`, the request that signed out has no user either (None, as for anyone never signed in): code
    after it in the same request never acts for the person who left."""
    with app.test_request_context("/"), runtime.of(app).context():
        identity.dev_sign_in("leaving@example.com", False)
        assert identity.current_user()["email"] == "leaving@example.com"
        identity.sign_out()
        assert identity.current_user() is None

