"""Each signed-in person's write budget (issue 57, item 9; core/budget.py): the issue's probe sent 30 comments and
then 20 new counters in about 2 s, all accepted. Now the figures of Settings.write_budget (docs/security.md) pass and
the next is a 429 with Retry-After, the API's error shape, and nothing written; the HTML forms answer with a page
that says so; another person is not held back; with the cache away writes go on."""
import pytest

from comments.models import Comment
from core import runtime
from core.settings import Settings, WriteBudget
from counters.models import CounterConfig
from tests.support import csrf_token, make_app, running

SMALL = "comments=3,counters=2,posts=2,window=600"


@pytest.fixture
def small(stack):
    """An app with small figures, so the test sends few requests; the default figures are checked below."""
    with running(make_app(stack, WRITE_BUDGET=SMALL, **stack.fresh()), flush=True) as app:
        yield app


def _stored(kind):
    with runtime.current().context():
        return len(kind.query().fetch(keys_only=True))


def _sign_in(client, email, admin=False):
    assert client.post("/api/session", json={"email": email, "admin": admin}).status_code == 200


def _refused(r):
    assert r.status_code == 429, (r.status_code, r.get_data(as_text=True)[:300])
    assert 1 <= int(r.headers["Retry-After"]) <= 600
    return r


def test_the_default_figures_are_the_documented_ones():
    assert Settings(project="p", emulator_host=None).write_budget == WriteBudget(20, 10, 20, 600)
    assert Settings.from_env({"DATASTORE_EMULATOR_HOST": "h:1", "WRITE_BUDGET": "comments=7"}).write_budget == \
        WriteBudget(comments=7)
    for bad in ("comments=0", "comments=x", "likes=3", "comments"):
        with pytest.raises(RuntimeError, match="WRITE_BUDGET"):
            Settings.from_env({"DATASTORE_EMULATOR_HOST": "h:1", "WRITE_BUDGET": bad})


def test_comments_past_the_budget_are_429_with_retry_after_and_write_nothing(small):
    client = small.test_client()
    _sign_in(client, "boss@example.com", admin=True)
    assert client.post("/api/blogs/news/entries", json={"title": "t", "body": "b"}).status_code == 201
    _sign_in(client, "ann@example.com")
    for i in range(3):
        assert client.post("/api/blogs/news/entries/0/comments", json={"text": f"c{i}"}).status_code == 201
    r = _refused(client.post("/api/blogs/news/entries/0/comments", json={"text": "one too many"}))
    error = r.get_json()["error"]
    assert error["code"] == "too_many_writes" and "3 comments" in error["message"]
    assert _stored(Comment) == 3
    # the form under the entry: a page that says why, with the same status and header
    token = csrf_token(client, "/blog/news/0")
    form = client.post("/blog/news/0/comments", data={"text": "by form", "csrf_token": token})
    _refused(form)
    assert "3 comments" in form.get_data(as_text=True) and "try again in" in form.get_data(as_text=True)
    assert _stored(Comment) == 3
    # another person has a budget of their own
    other = small.test_client()
    _sign_in(other, "bob@example.com")
    assert other.post("/api/blogs/news/entries/0/comments", json={"text": "mine"}).status_code == 201


def test_new_counters_past_the_budget_are_429_adding_to_existing_ones_is_not_counted(small):
    client = small.test_client()
    _sign_in(client, "ann@example.com")
    for name in ("a1", "a2"):
        assert client.post(f"/api/counters/{name}/increment").status_code == 200
    r = _refused(client.post("/api/counters/a3/increment"))
    assert r.get_json()["error"]["code"] == "too_many_writes" and "new counters" in r.get_json()["error"]["message"]
    assert client.get("/api/counters/a3").status_code == 404 and _stored(CounterConfig) == 2
    for _ in range(5):  # increments of counters that exist spend nothing
        assert client.post("/api/counters/a1/increment").status_code == 200
    form = client.post("/counters/a4/increment", data={"csrf_token": csrf_token(client)})
    _refused(form)
    assert "new counters" in form.get_data(as_text=True)
    # an admin's creations count too (PUT, the form, a burst's new counter); growing one that exists does not
    admin = small.test_client()
    _sign_in(admin, "boss@example.com", admin=True)
    assert admin.put("/api/counters/b1", json={"mode": "general"}).status_code == 200
    assert admin.put("/api/counters/b1", json={"mode": "general", "num_shards": 30}).status_code == 200
    assert admin.put("/api/counters/b2", json={"mode": "adaptive"}).status_code == 200
    _refused(admin.put("/api/counters/b3", json={"mode": "general"}))
    assert admin.get("/api/counters/b3").status_code == 404


def test_posts_past_the_budget_are_429(small):
    client = small.test_client()
    _sign_in(client, "boss@example.com", admin=True)
    for i in range(2):
        assert client.post("/api/blogs/news/entries", json={"title": f"t{i}", "body": "b"}).status_code == 201
    _refused(client.post("/api/blogs/news/entries", json={"title": "t2", "body": "b"}))
    token = csrf_token(client, "/blog/news")
    form = client.post("/blog/news/entries", data={"title": "t", "body": "b", "csrf_token": token})
    _refused(form)
    assert client.get("/api/blogs/news/entries").get_json()["max_index"] == 1


def test_with_the_cache_away_writes_go_on_uncounted(stack, small):
    """More comments than the budget while the cache is stopped: all written (counter configs are a globally cached
    kind, whose writes wait for the cache whatever the budget: core/cache.py)."""
    client = small.test_client()
    _sign_in(client, "boss@example.com", admin=True)
    assert client.post("/api/blogs/news/entries", json={"title": "t", "body": "b"}).status_code == 201
    _sign_in(client, "ann@example.com")
    stack.cache.stop()
    try:
        for i in range(5):
            r = client.post("/api/blogs/news/entries/0/comments", json={"text": f"c{i}"})
            assert r.status_code == 201, r.get_data(as_text=True)
    finally:
        stack.cache.restart()
    assert _stored(Comment) == 5
