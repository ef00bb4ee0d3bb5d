"""The holes of the "Integrity" issue, each reproduced and shown closed: forged feature counters, anonymous creation,
the entry page's title, security headers, GETs that wrote, and the middleware dropping `close()`."""
import dataclasses
import re
from html.parser import HTMLParser

from flask import Response, stream_with_context
from google.cloud import ndb
from google.cloud.ndb import context as context_module

from accounts import service as accounts_service
from blog import view_counts as blog
from comments import service as comments
from core import identity, people, runtime
from counters.models import CounterConfig, CounterShard
from main import create_app
from mapper.models import MapperJob
from tests.support import csrf_token, running, settings_for

FEATURE_COUNTERS = ("comments:b.0", "blog:b.0.views")


def _entry_with_comments(client, auth, count=3):
    auth.admin()
    assert client.post("/api/blogs/b/entries", json={"title": "T", "body": "B"}).status_code == 201
    for n in range(count):
        assert client.post("/api/blogs/b/entries/0/comments", json={"text": f"c{n}"}).status_code == 201
    assert client.post("/api/blogs/b/entries/0/views").status_code == 200
    auth.sign_out()


def _comment_count(client):
    return client.get("/api/blogs/b/entries/0").get_json()["comment_count"]


def _entities(kind):
    with runtime.current().context():
        return ndb.Query(kind=kind).fetch(keys_only=True)


# --- a feature's counters are not the public's -------------------------------------------------------------------

def test_nobody_can_forge_an_entrys_comment_or_view_count(client, auth):
    _entry_with_comments(client, auth)
    assert _comment_count(client) == 3
    shards_before = len(_entities("CounterShard"))
    for who in (None, "user", "admin"):
        if who == "user":
            auth.sign_in("mallory@example.com")
        elif who == "admin":
            auth.admin()
        for name in FEATURE_COUNTERS:
            for method, path, body in (("post", f"/api/counters/{name}/increment", None),
                                       ("get", f"/api/counters/{name}", None),
                                       ("put", f"/api/counters/{name}", {"mode": "general", "num_shards": 5}),
                                       ("post", f"/api/counters/{name}/shards", {"num_shards": 50}),
                                       ("post", f"/api/counters/{name}/burst", {"writers": 2, "increments": 5})):
                r = getattr(client, method)(path, json=body) if body else getattr(client, method)(path)
                assert (who, path, r.status_code) == (who, path, 403), r.get_json()
                assert r.get_json()["error"]["code"] == "reserved_counter"
        token = csrf_token(client)
        r = client.post("/counters/comments:b.0/increment", data={"csrf_token": token})
        assert r.status_code == 403 and "kept by the app" in r.get_data(as_text=True)
    assert _comment_count(client) == 3
    assert len(_entities("CounterShard")) == shards_before
    with runtime.current().context():
        assert ndb.Key(CounterConfig, "comments:b.0").get().num_shards == 1  # not grown by the refused PUT/shards
    listed = client.get("/api/counters").get_json()["counters"]
    assert listed == []
    assert "comments:b.0" not in client.get("/counters").get_data(as_text=True)


def test_any_name_with_the_owner_separator_is_reserved_and_malformed_ones_are_400(client, auth):
    auth.admin()
    for name in ("x:y", "blog:", "comments:anything.at.all", "Blog:x"):
        assert client.post(f"/api/counters/{name}/increment").status_code == 403
    assert client.post("/api/counters/bad name/increment").status_code == 400
    assert client.post(f"/api/counters/{'a' * 101}/increment").status_code == 400
    assert _entities("CounterConfig") == []


def test_owner_handles_keep_their_counters_apart(ndb_context):
    assert blog.COUNTERS.name("b.0.views") == "blog:b.0.views"
    assert comments.COUNTERS.name("b.0") == "comments:b.0"
    assert comments.COUNTERS.increment("b.0") and comments.COUNTERS.increment("b.0")
    assert blog.COUNTERS.increment("b.0.views")
    assert comments.COUNTERS.totals(["b.0", "b.1"]) == {"b.0": 2, "b.1": 0}
    assert blog.COUNTERS.exact_totals(["b.0.views"]) == {"b.0.views": 1}
    config = ndb.Key(CounterConfig, "comments:b.0").get()
    assert (config.mode, config.listed) == ("adaptive", False)


# --- creating a counter needs a signed-in user -------------------------------------------------------------------

def test_anonymous_increment_of_a_new_counter_is_401_and_writes_nothing(client, auth):
    for n in range(5):
        r = client.post(f"/api/counters/flood-{n}/increment")
        assert r.status_code == 401 and r.get_json()["error"]["code"] == "sign_in_to_create"
    r = client.post("/counters/flood-x/increment", data={"csrf_token": csrf_token(client)})
    assert r.status_code == 401
    assert _entities("CounterConfig") == [] and _entities("CounterShard") == []

    auth.sign_in("ann@example.com")
    assert client.post("/api/counters/flood-0/increment").get_json()["applied"] is True
    auth.sign_out()
    # Once it exists, anyone may add to it (the demo counters stay open to everyone), and the simple counter too.
    assert client.post("/api/counters/flood-0/increment").status_code == 200
    assert client.get("/api/counters/flood-0").get_json()["count"] == 2
    assert client.post("/api/simple-counter/increment").status_code == 200
    assert [k.id() for k in _entities("CounterConfig")] == ["flood-0"]


# --- titles -----------------------------------------------------------------------------------------------------

class _Title(HTMLParser):
    """The document's <title> (the one in <head>; an SVG's <title> elements are tooltips), and any markup inside it."""

    def __init__(self):
        super().__init__()
        self.head = self.inside = False
        self.text, self.count = "", 0

    def handle_starttag(self, tag, attrs):
        if tag == "head":
            self.head = True
        elif tag == "title" and self.head:
            self.inside, self.count = True, self.count + 1
        elif self.inside:
            self.text += f"<{tag}>"

    def handle_endtag(self, tag):
        if tag == "title":
            self.inside = False
        elif tag == "head":
            self.head = False

    def handle_data(self, data):
        if self.inside:
            self.text += data


def _html_pages(client, auth):
    _entry_with_comments(client, auth)
    auth.admin()
    client.put("/api/counters/likes", json={"mode": "adaptive"})
    job = client.post("/api/jobs", json={"name": "recount_comments"}).get_json()
    return ["/", "/counters", "/blog", "/blog/b", "/blog/b/0", "/blog/b/0?page=last", "/jobs", f"/jobs/{job['id']}",
            "/accounts", "/numbers", "/signin", "/source/counters/service.py", "/no/such/page", "/blog/nope"]


def test_every_html_page_has_one_short_plain_text_title(client, auth):
    for path in _html_pages(client, auth):
        r = client.get(path)
        assert r.mimetype == "text/html", path
        title = _Title()
        title.feed(r.get_data(as_text=True))
        text = " ".join(title.text.split())
        assert title.count == 1, (path, title.count)
        assert text and "<" not in text and len(text) <= 100, (path, text)
    entry = _Title()
    entry.feed(client.get("/blog/b/0").get_data(as_text=True))
    assert " ".join(entry.text.split()) == "T · Scalable Datastore"


# --- security headers ----------------------------------------------------------------------------------------------

def _assert_secured(r, what):
    csp = r.headers.get("Content-Security-Policy", "")
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";") if d.strip())
    assert directives.get("script-src") == "'self'" and directives.get("frame-ancestors") == "'none'", (what, csp)
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, (what, csp)
    assert r.headers.get("X-Content-Type-Options") == "nosniff", what
    assert r.headers.get("X-Frame-Options") == "DENY", what
    assert r.headers.get("Referrer-Policy") == "strict-origin-when-cross-origin", what


def test_security_headers_on_pages_json_errors_and_static_files(client, auth):
    auth.sign_in("ann@example.com")
    responses = {
        "html page": client.get("/counters"),
        "json": client.get("/api/counters"),
        "html 404": client.get("/no/such/page"),
        "json 404": client.get("/api/counters/missing"),
        "json 401": client.delete("/api/session") and client.get("/api/session"),
        "json 415": client.post("/api/counters/x/increment", data="x=1", content_type="text/plain"),
        "json 405": client.delete("/api/counters"),
        "static": client.get("/static/js/counters.js"),
        "feed": client.get("/blog/none/feed.atom"),
    }
    for what, r in responses.items():
        _assert_secured(r, what)
        assert "Strict-Transport-Security" not in r.headers, what  # plain HTTP locally: no HSTS
    assert responses["json 415"].status_code == 415 and responses["json 405"].status_code == 405


def test_hsts_only_on_app_engine(stack):
    settings = settings_for(stack)
    gae = create_app(dataclasses.replace(settings, on_app_engine=True), TESTING=True)
    with running(gae):
        r = gae.test_client().get("/healthz", base_url="https://example.appspot.com")
        assert r.headers["Strict-Transport-Security"].startswith("max-age=31556926")
        _assert_secured(r, "App Engine")
        assert gae.config["SESSION_COOKIE_SECURE"] is True
    local = create_app(settings, TESTING=True)
    with running(local):
        r = local.test_client().get("/healthz", base_url="https://localhost")
        assert "Strict-Transport-Security" not in r.headers


def test_no_template_has_inline_script_or_style():
    from pathlib import Path
    for template in Path(__file__).resolve().parent.parent.joinpath("templates").rglob("*.html"):
        text = template.read_text()
        assert "<script>" not in text and "<style" not in text and " style=" not in text, template
        assert " onclick=" not in text and " onload=" not in text and "javascript:" not in text, template


# --- a GET never writes --------------------------------------------------------------------------------------------

def _snapshot():
    """Every entity of every kind the app's models define, by key, read in a fresh context (no cache): a GET must
    leave this exactly as it was. (Kinds from the models, not a __kind__ query: the Firestore emulator refuses
    those.)"""
    with runtime.current().context():
        return {entity.key: entity.to_dict() for kind in sorted(ndb.Model._kind_map)
                for entity in ndb.Query(kind=kind).fetch()}


def test_gets_leave_the_datastore_unchanged(client, auth, task_queue):
    pages = _html_pages(client, auth)
    client.post("/api/accounts/seed", json={"count": 30})
    task_queue.drain()
    job = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 5}}).get_json()
    task_queue.drain()
    # A job whose every range has reported back but that was never marked finished (its last task died before
    # noticing): reading it used to finish it.
    with runtime.current().context():
        stuck = MapperJob.get_by_id(job["id"])
        stuck.ended, stuck.outcome, stuck.summary = None, None, None
        stuck.put()
    reads = pages + ["/api/counters", "/api/counters/likes?shards=1", "/api/simple-counter?shards=1", "/api/blogs",
                     "/api/blogs/b/entries", "/api/blogs/b/entries/0", "/api/blogs/b/entries/0/comments?page=last",
                     "/api/jobs", f"/api/jobs/{job['id']}", f"/jobs/{job['id']}", "/api/accounts/summary",
                     "/api/session", "/api/openapi.json", "/healthz", "/blog/b/feed.atom", "/api/numbers"]
    before = _snapshot()
    assert before
    for who in (None, "admin"):
        if who:
            auth.admin()
        for path in reads:
            assert client.get(path).status_code in (200, 404), path
        assert _snapshot() == before, f"a GET wrote (signed in as {who})"
    assert client.get(f"/api/jobs/{job['id']}").get_json()["state"] == "running"
    assert client.get(f"/api/jobs/{job['id']}").get_json()["progress"] == 1.0


def test_a_job_is_finished_by_its_last_task_or_by_an_admin_never_by_a_read(client, auth, task_queue):
    auth.admin()
    client.post("/api/accounts/seed", json={"count": 60})
    task_queue.drain()
    job = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 1}, "page_size": 10}).get_json()
    assert client.post(f"/api/jobs/{job['id']}/finish").status_code == 409  # ranges still out
    task_queue.drain()
    assert client.get(f"/api/jobs/{job['id']}").get_json()["state"] == "done"  # the last task finished it
    with runtime.current().context():
        # As if its last task had died before finishing it: not finished, and so (the same transaction) its credit
        # not yet settled on the kept balance.
        def unfinish():
            stuck = MapperJob.get_by_id(job["id"])
            stuck.ended = None
            ndb.put_multi([stuck, *accounts_service.COUNTERS.add_in_transaction(accounts_service.BALANCE, -60)])
        ndb.transaction(unfinish)
    assert client.get(f"/api/jobs/{job['id']}").get_json()["state"] == "running"
    auth.sign_in("ann@example.com")
    assert client.post(f"/api/jobs/{job['id']}/finish").status_code == 403
    auth.admin()
    finished = client.post(f"/api/jobs/{job['id']}/finish")
    assert finished.status_code == 200 and finished.get_json()["state"] == "done"
    assert finished.get_json()["processed"] == 60
    assert client.get("/api/accounts/summary").get_json() == {"count": 60, "total_balance": 60}
    r = client.post(f"/jobs/{job['id']}/finish", data={"csrf_token": csrf_token(client, f"/jobs/{job['id']}")})
    assert r.status_code == 302  # finishing a finished job again changes nothing


def test_the_entry_page_counts_its_view_by_post_not_by_get(client, auth):
    _entry_with_comments(client, auth, count=0)
    views = client.get("/api/blogs/b/entries/0").get_json()["views"]
    for _ in range(3):
        client.get("/blog/b/0")
    assert client.get("/api/blogs/b/entries/0").get_json()["views"] == views
    assert client.post("/api/blogs/b/entries/0/views").get_json() == {"views": views + 1}
    html = client.get("/blog/b/0").get_data(as_text=True)
    assert 'data-view-url="/api/blogs/b/entries/0/views"' in html and "js/entry.js" in html
    # Only entries that exist get a view counter.
    assert client.post("/api/blogs/b/entries/7/views").status_code == 404
    assert client.post("/api/blogs/zz/entries/0/views").status_code == 404
    assert client.post("/api/blogs/b/entries/x/views").status_code == 400
    assert [k.id() for k in _entities("CounterConfig") if k.id().startswith("blog:")] == ["blog:b.0.views"]


# --- the middleware keeps close() --------------------------------------------------------------------------------

def test_the_middleware_streams_in_the_requests_context_and_runs_close(app):
    with runtime.current().context():
        CounterShard(id="probe|0", count=7).put()
    seen = []

    @app.get("/_test/stream")
    def stream():
        def chunks():
            for n in range(3):
                # Produced lazily, while the server sends the body: ndb still works here.
                yield f"{n}:{ndb.Key(CounterShard, 'probe|0').get().count};"
        response = Response(stream_with_context(chunks()))
        response.call_on_close(lambda: seen.append(("closed", ndb.Key(CounterShard, "probe|0").get().count)))
        return response

    def start_response(status, headers, exc_info=None):
        seen.append(status)

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/_test/stream", "SERVER_NAME": "localhost", "SERVER_PORT": "80",
               "wsgi.url_scheme": "http", "wsgi.input": None, "wsgi.errors": None}
    # As a WSGI server does (PEP 3333): call, read the body, then close() it.
    body = app(environ, start_response)
    assert context_module.get_context(False) is None  # nothing left on the thread before the body is read
    chunks = list(body)
    assert context_module.get_context(False) is None
    assert seen == ["200 OK"]  # close() has not run yet: the server has not called it
    body.close()
    assert b"".join(chunks) == b"0:7;1:7;2:7;"
    assert seen == ["200 OK", ("closed", 7)]


def test_another_sites_page_cannot_act_with_the_visitors_cookie(client, auth):
    """A page elsewhere can make a signed-in visitor's browser POST here without a body (fetch with mode "no-cors",
    sendBeacon): no Content-Type to refuse, the cookie sent along for a top-level or same-site-lax case. The browser's
    own Sec-Fetch-Site / Origin headers say where it came from; such a request is refused and writes nothing."""
    auth.admin()
    client.put("/api/counters/guarded", json={"mode": "general"})
    before = client.get("/api/counters/guarded").get_json()["count"]
    elsewhere = ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                 {"Origin": "https://evil.example"}, {"Origin": "null"})
    for headers in elsewhere:
        for path in ("/api/counters/guarded/increment", "/api/numbers", "/api/accounts/aggregation"):
            r = client.post(path, headers=headers)
            assert r.status_code == 403 and r.get_json()["error"]["code"] == "cross_site", (path, headers)
    assert client.get("/api/counters/guarded").get_json()["count"] == before
    assert client.get("/api/numbers").status_code == 404  # never measured: the refused POST wrote nothing
    # The app's own pages (same-origin), a typed request ("none"), and clients that are not browsers still work.
    for headers in ({"Sec-Fetch-Site": "same-origin"}, {"Origin": "http://localhost"}, {}):
        assert client.post("/api/counters/guarded/increment", headers=headers).status_code == 200, headers
    assert client.get("/api/counters/guarded").get_json()["count"] == before + 3


def test_a_body_nested_past_the_parser_is_a_400(client, auth):
    """Through the route that takes the largest bodies (an entry's: its limit lets these reach the parser), a body
    nested deeper than Python's parser goes is a 400; on a route that takes a few fields it is a 413 before parsing."""
    auth.admin()
    for body in ("[" * 50_000, '{"a":' * 50_000):
        r = client.post("/api/blogs/deep/entries", data=body, content_type="application/json")
        assert r.status_code == 400 and r.get_json()["error"]["code"] == "bad_json"
        assert client.put("/api/counters/deep", data=body, content_type="application/json").status_code == 413
    assert client.get("/api/blogs/deep/entries").status_code == 404
    assert client.get("/api/counters/deep").status_code == 404


# --- a public id is keyed by the app's secret ----------------------------------------------------------------------

def test_a_persons_public_id_is_keyed_by_the_apps_secret(app, monkeypatch):
    """A comment's id carries its author's pseudonym (people.pseudonym): an HMAC under SECRET_KEY, so nobody without
    the key computes it from an email or a Google `sub`, however it is hashed. Under another key the same person has
    another one; under the same key, always the same."""
    rt = runtime.of(app)
    user = identity.make_user(identity.dev_user_id("ann@example.com"), "ann@example.com", False)
    seen = []
    with rt.activated():
        for secret in ("a" * 32, "b" * 32, "a" * 32):
            monkeypatch.setattr(rt, "settings", dataclasses.replace(rt.settings, secret_key=secret))
            seen.append(people.pseudonym(user))
    assert seen[0] == seen[2] != seen[1], seen
    assert all(re.fullmatch(r"u[0-9a-f]{24}", p) for p in seen), seen
