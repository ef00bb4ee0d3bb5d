"""The structure the code claims: each app owns its runtime and registries, nothing registers by being imported, and
the blog stands without comments (they add to it only through its EntryAddon hook)."""
import re
import subprocess

import pytest
from google.cloud import ndb

import accounts
import blog
import comments
import counters
import tour
from blog import pages
from blog.models import BlogEntry
from core import features, runtime
from core.runtime import Runtime
from devstack.apps import app_on
from mapper import jobs as mapper_jobs
from tests.support import TEST_ENV, make_app, running, settings_for


def test_each_app_keeps_its_own_runtime_and_registries(stack):
    """Two apps in one process (the tests build many): neither replaces, closes or sees the other's runtime."""
    first = make_app(stack, checked=False, **stack.emulator.fresh())
    second = make_app(stack, checked=False, DATASTORE_NAMESPACE="second-app")
    one, two = runtime.of(first), runtime.of(second)
    assert one is not two and one.registry(mapper_jobs.JOBS) is not two.registry(mapper_jobs.JOBS)
    assert set(one.registry(mapper_jobs.JOBS)) == set(two.registry(mapper_jobs.JOBS)) == {
        "add_credit", "add_credit_increments", "audit_accounts", "recount_comments"}
    with running(second):
        client = second.test_client()
        assert client.post("/api/session", json={"email": "boss@example.com", "admin": True}).status_code == 200
        assert client.post("/api/blogs/two/entries", json={"title": "t", "body": "b"}).status_code == 201
        with running(first):  # built first, closed first: the second app still serves
            assert first.test_client().get("/api/blogs/two/entries").status_code == 404  # another namespace
        assert client.get("/api/blogs/two/entries").get_json()["max_index"] == 0
        assert runtime.current() is two  # what the block made current is current again


def test_no_runtime_is_current_outside_a_request_or_a_block(stack):
    with pytest.raises(RuntimeError, match="no runtime is current"):
        runtime.current()
    rt = Runtime(settings_for(stack))
    try:
        with rt.activated():
            assert runtime.current() is rt
        with pytest.raises(RuntimeError):
            runtime.current()
    finally:
        rt.close()


def test_nothing_registers_by_being_imported(stack):
    """Every feature is imported (this module imports them all): a runtime still gets task handlers and jobs only from
    the init_app of an app built on it."""
    assert accounts.credit.ADD_CREDIT and comments.recount.RECOUNT  # defined on import, registered nowhere
    rt = Runtime(settings_for(stack))
    try:
        assert rt.tasks.handler("mapper.run") is None and rt.registry(mapper_jobs.JOBS) == {}
        with pytest.raises(ValueError, match="no task handler"):
            rt.tasks.enqueue("accounts.seed", {}, "t-1")
    finally:
        rt.close()
    app = make_app(stack, checked=False)
    with running(app):
        rt = runtime.of(app)
        assert rt.tasks.handler("mapper.run") is not None and rt.tasks.handler("accounts.seed") is not None
        registered = features.of(app)
        assert [f.name for f in registered.all] == ["counters", "blog", "comments", "mapper", "accounts", "tour",
                                                   "latency", "planner", "appstats"]
        assert [label for _, label in registered.navigation] == ["Counters", "Blog", "Jobs", "Accounts", "Numbers"]
        assert list(registered.lesson_index) == ["counters", "blog", "comments", "mapper"]
        with pytest.raises(ValueError, match="registered already"):
            mapper_jobs.register(app, comments.recount.RECOUNT)
        with pytest.raises(ValueError, match="already"):
            rt.tasks.register("mapper.run", print)
        with pytest.raises(RuntimeError, match="after the app's features were completed"):
            features.add(app, features.Feature(name="late"))  # complete: no feature joins a built app


def test_the_blog_stands_without_comments(stack):
    """An app of counters, blog and the tour (the site's home and source viewer, which every page links): entries,
    pages and their JSON work, and nothing of comments is there."""
    app = app_on(stack, features_list=(counters, blog, tour), **TEST_ENV, **stack.emulator.fresh())
    with running(app):
        client = app.test_client()
        assert client.post("/api/session", json={"email": "boss@example.com", "admin": True}).status_code == 200
        assert client.post("/api/blogs/solo/entries", json={"title": "Alone", "body": "b"}).status_code == 201
        entry = client.get("/api/blogs/solo/entries/0").get_json()
        assert entry["title"] == "Alone" and entry["views"] == 0 and "comment_count" not in entry
        page = client.get("/blog/solo/0").get_data(as_text=True)
        assert "Alone" in page and "comment" not in page.lower()
        assert "comment" not in client.get("/blog/solo").get_data(as_text=True).lower()
        assert client.get("/api/blogs/solo/entries/0/comments").status_code == 404  # no such route here
        schema = app.extensions["openapi"]["components"]["schemas"]["EntryAddonFields"]
        assert schema["properties"] == {} and schema["required"] == []
        assert app.extensions.get(pages.EXTENSION) is None


def test_comments_add_their_fields_through_the_hook(app, client, auth):
    auth.admin()
    assert client.post("/api/blogs/hooked/entries", json={"title": "t", "body": "b"}).status_code == 201
    assert client.post("/api/blogs/hooked/entries/0/comments", json={"text": "hi"}).status_code == 201
    assert client.get("/api/blogs/hooked/entries/0").get_json()["comment_count"] == 1
    assert [a.name for a in app.extensions[pages.EXTENSION]] == ["comments"]
    schema = app.extensions["openapi"]["components"]["schemas"]["EntryAddonFields"]
    assert schema["required"] == ["comment_count"]
    with runtime.current().context():
        assert len(BlogEntry.query(ancestor=ndb.Key("BlogIndex", "hooked")).fetch(keys_only=True)) == 1


def test_the_repo_carries_its_own_design():
    """docs/ holds the architecture and the HTTP contract, and nothing in the tree cites a document a clone does not
    have (the team's shared design and API documents, or anything else outside the repo)."""
    repo = features.REPO
    assert (repo / "docs" / "architecture.md").is_file() and (repo / "docs" / "api.md").is_file()
    tracked = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"\b(?:DESIGN|API)\.md\b|\.\./shared\b")
    citing = [path for path in tracked if path.endswith((".py", ".md", ".yaml", ".toml", ".html", ".txt", "Makefile"))
              and not path.startswith("bench/results/")
              and outside.search((repo / path).read_text(errors="replace").replace("docs/api.md", ""))]
    assert citing == []
