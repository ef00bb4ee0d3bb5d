"""Sessions revocable and absolute (issue 57, item 3), and where the dev sign-in exists (item 7), each probe sent as
the issue sent it: save the cookie, sign out, send the old cookie again; a cookie re-issued by use but signed in more
than 12 hours ago; the dev sign-in with K_SERVICE (Cloud Run) set."""
import dataclasses
import threading
import time

import pytest

from core import identity, runtime
from core.settings import Settings
from devstack.apps import app_on
from devstack.services import CACHES
from main import create_app
from tests.support import TEST_ENV, csrf_token, make_app, running

EMAIL = "ann@example.com"


def _cookie(client):
    return client.get_cookie("session", domain="localhost").value


def _session_of(app, cookie):
    return app.session_interface.get_signing_serializer(app).loads(cookie)


def _replay(client, cookie):
    client.set_cookie("session", cookie, domain="localhost")


def _writes_refused(client):
    """Writes a signed-in person may make, each refused as from nobody (401), nothing written: the issue's comment
    (entry 0 of blog "news" exists), a counter created, an entry posted."""
    r = client.post("/api/blogs/news/entries/0/comments", json={"text": "posted with a revoked cookie"})
    assert r.status_code == 401 and r.get_json()["error"]["code"] == "sign_in_required"
    assert client.get("/api/blogs/news/entries/0/comments").get_json()["comments"] == []
    assert client.post("/api/blogs/news/entries", json={"title": "t", "body": "b"}).status_code == 401
    assert client.put("/api/counters/mine", json={"mode": "general"}).status_code == 401
    assert client.post("/api/counters/newname/increment").status_code == 401
    assert client.get("/api/counters/newname").status_code == 404


def test_a_cookie_saved_before_sign_out_is_nobodys_after_it(client, auth):
    """The issue's probe: save the cookie, DELETE /api/session (204), send the old cookie: it was 200 with the user,
    and a write went through with a re-issued cookie. Now 401, and every write refused."""
    auth.sign_in(EMAIL, admin=True)
    assert client.post("/api/blogs/news/entries", json={"title": "t", "body": "b"}).status_code == 201
    saved = _cookie(client)
    assert client.get("/api/session").status_code == 200
    assert client.delete("/api/session").status_code == 204
    _replay(client, saved)
    r = client.get("/api/session")
    assert r.status_code == 401 and r.get_json()["error"]["code"] == "sign_in_required"
    _replay(client, saved)
    _writes_refused(client)
    # signing in again works, with a cookie the old one is not
    auth.sign_in(EMAIL, admin=True)
    assert client.get("/api/session").get_json()["user"]["email"] == EMAIL
    _replay(client, saved)
    assert client.get("/api/session").status_code == 401


def test_signing_out_with_the_form_ends_every_copy_too_and_every_browser_of_that_person(app, client):
    """Sign-out ends the person's sign-ins made so far, wherever their cookies are (another browser too), as the API's
    does; another person stays signed in."""
    other_browser, someone_else = app.test_client(), app.test_client()
    for c, email in ((client, EMAIL), (other_browser, EMAIL), (someone_else, "bob@example.com")):
        assert c.post("/api/session", json={"email": email, "admin": False}).status_code == 200
    saved = _cookie(client)
    r = client.post("/signout", data={"csrf_token": csrf_token(client)})
    assert r.status_code == 302
    _replay(client, saved)
    assert client.get("/api/session").status_code == 401
    assert other_browser.get("/api/session").status_code == 401
    assert someone_else.get("/api/session").status_code == 200


def test_a_sign_in_ends_twelve_hours_after_it_was_made_however_the_cookie_was_used(app, client, auth):
    """A cookie used all along is re-issued (freshly signed) on every change to the session: Flask's own age check
    counts from that. The sign-in's time inside it is what counts: one signed in 12 hours ago is nobody's even when
    the cookie was signed a second ago."""
    auth.sign_in(EMAIL)
    data = _session_of(app, _cookie(client))
    serializer = app.session_interface.get_signing_serializer(app)
    for age, status in ((identity.SESSION_HOURS * 3600 + 5, 401), (identity.SESSION_HOURS * 3600 - 60, 200)):
        _replay(client, serializer.dumps({**data, "signed_in": int(time.time()) - age}))  # signed just now
        assert client.get("/api/session").status_code == status, age
    # a cookie that carries no sign-in time (made before sessions carried one) or a wrong one is nobody's
    for broken in ({k: v for k, v in data.items() if k != "signed_in"}, {**data, "signed_in": "yesterday"},
                   {**data, "generation": None}, {**data, "signed_in": int(time.time()) + 3600}):
        _replay(client, serializer.dumps(broken))
        assert client.get("/api/session").status_code == 401, broken


def test_the_sign_in_time_does_not_move_when_the_cookie_is_reissued(app, client, auth):
    """The issue's probe: a comment posted with the cookie came back with a re-issued cookie whose timestamp moved
    on. The cookie is still re-issued (the session remembers the comment), but the sign-in's time in it stays."""
    client.post("/api/session", json={"email": "boss@example.com", "admin": True})
    assert client.post("/api/blogs/news/entries", json={"title": "t", "body": "b"}).status_code == 201
    auth.sign_in(EMAIL)
    before = _cookie(client)
    time.sleep(1.1)
    r = client.post("/api/blogs/news/entries/0/comments", json={"text": "hello"})
    assert r.status_code == 201 and "session=" in r.headers.get("Set-Cookie", "")  # re-issued
    after = _cookie(client)
    assert after != before
    assert _session_of(app, after)["signed_in"] == _session_of(app, before)["signed_in"]


def test_sign_out_in_one_app_ends_the_cookie_in_another(stack, client, auth):
    """Two apps on one stack, as two processes (or instances): each its own cache client and ndb client, sharing only
    Datastore and the cache server. A sign-out answered by one ends the cookie the other was serving."""
    with running(make_app(stack)) as other:
        elsewhere = other.test_client()
        auth.sign_in(EMAIL)
        saved = _cookie(client)
        _replay(elsewhere, saved)
        assert elsewhere.get("/api/session").status_code == 200  # its cache now holds the generation
        assert client.delete("/api/session").status_code == 204
        assert elsewhere.get("/api/session").status_code == 401


def test_revocation_holds_with_the_cache_away(stack, app, client, auth):
    """With the cache stopped, the generation is read from Datastore on every signed-in request: signing in and out
    still work, and the old cookie is still refused. Once the cache is back, it is refused still."""
    auth.sign_in(EMAIL)
    stack.cache.stop()
    try:
        auth.sign_in(EMAIL)
        saved = _cookie(client)
        assert client.get("/api/session").status_code == 200
        assert client.delete("/api/session").status_code == 204
        _replay(client, saved)
        assert client.get("/api/session").status_code == 401
    finally:
        stack.cache.restart()
    _replay(client, saved)
    assert client.get("/api/session").status_code == 401


def test_a_signed_in_request_reads_the_generation_from_the_cache(client, auth):
    """What revocation costs a signed-in request: one cache call, no Datastore read, once warm."""
    from tests.support import timing
    auth.sign_in(EMAIL)
    client.get("/api/session")
    r = client.get("/api/session")
    assert r.status_code == 200 and timing(r)["datastore"][0] == 0


# --- where the dev sign-in exists (item 7) -------------------------------------------------------------------------

def test_the_dev_sign_in_is_on_exactly_against_an_emulator_with_dev_signin_on_off_app_engine():
    """docs/security.md's rule, on every platform: the platform's own variables (K_SERVICE on Cloud Run, GAE_ENV on
    App Engine flex) decide nothing; the emulator does. App Engine standard never."""
    emulator = {"DATASTORE_EMULATOR_HOST": "127.0.0.1:8081"}
    secret = {"SECRET_KEY": "x" * 32}
    for platform in ({}, {"K_SERVICE": "app"}, {"GAE_ENV": "flex"}):
        assert not Settings.from_env({**platform, **secret, "DEV_SIGNIN": "on"}).dev_signin, platform
        assert Settings.from_env({**platform, **emulator, "DEV_SIGNIN": "on"}).dev_signin, platform
        assert not Settings.from_env({**platform, **emulator}).dev_signin, platform
    assert not Settings.from_env({"GAE_ENV": "standard", **emulator, **secret, "DEV_SIGNIN": "on",
                                  "TASKS_LOCATION": "us-central1",
                                  "GOOGLE_CLIENT_ID": "1-x.apps.googleusercontent.com"}).dev_signin


def test_on_cloud_run_the_dev_sign_in_is_not_there(stack):
    """The issue's probe: K_SERVICE set (Cloud Run), DEV_SIGNIN=on, a trusted host, `POST /api/session` signed in an
    admin. A Cloud Run service reads the real Datastore: no DATASTORE_EMULATOR_HOST, so 404 and nobody signed in.
    (The app here still talks to the test's emulator: the settings are read without its address, then given it.)"""
    env = {k: v for k, v in stack.env().items() if k != "DATASTORE_EMULATOR_HOST"}
    settings = Settings.from_env({**env, **TEST_ENV, "K_SERVICE": "app", "DEV_SIGNIN": "on",
                                  "TRUSTED_HOSTS": "localhost", "SECRET_KEY": "k" * 32})
    app = create_app(dataclasses.replace(settings, emulator_host=stack.emulator.host), TESTING=True)
    with running(app):
        client = app.test_client()
        r = client.post("/api/session", json={"email": "x@example.com", "admin": True})
        assert r.status_code == 404 and r.get_json()["error"]["code"] == "not_found"
        assert client.get("/api/session").status_code == 401
        assert client.post("/signin", data={"email": "x@example.com", "admin": "on"}).status_code in (400, 404)
    # the same service against an emulator is local development: there it is on, as documented
    with running(app_on(stack, **TEST_ENV, K_SERVICE="app")) as local:
        assert local.test_client().post("/api/session", json={"email": "x@example.com"}).status_code == 200
        assert runtime.of(local).settings.dev_signin


@pytest.fixture(scope="module", params=sorted(CACHES))
def each_cache(request):
    """A cache server of each kind, of its own, whichever cache the run's stack has."""
    server = CACHES[request.param]().start()
    yield server
    server.stop()


@pytest.mark.parametrize("dropped", [False, True], ids=["kept", "evicted"])
def test_a_generation_read_before_a_sign_out_is_never_cached_after_it(stack, each_cache, dropped, monkeypatch):
    """Issue 75, item 4 (and 73's surviving break): a signed-in request that misses the cached generation reads the
    old one from Datastore; the person signs out elsewhere (the new generation written, then stored in the cache);
    the first request then stores what it read. Forced in that order on both caches, with the sign-out's copy kept,
    and dropped before the store (an eviction, a flush). Stored, the old read would bring every signed-out cookie back
    for GENERATION_LIFETIME; the reader's claim (identity.generation) keeps it out: the saved cookie stays nobody's."""
    app = make_app(stack, **stack.fresh(), **each_cache.env())
    with running(app, flush=True):
        client = app.test_client()
        client.post("/api/session", json={"email": EMAIL, "admin": False})
        saved, user_id = _cookie(client), client.get("/api/session").get_json()["user"]["id"]
        cache, key = runtime.of(app).cache, identity._generation_key(user_id)
        assert cache.backend == each_cache.backend
        cache.delete(key)  # the cached copy gone (expired): the next request reads Datastore

        read, resume = threading.Event(), threading.Event()
        reading = identity.SessionGeneration.get_by_id

        def read_then_wait(*args, **kwargs):
            found = reading(*args, **kwargs)
            if threading.current_thread().name == "reader":
                read.set()
                assert resume.wait(10)
            return found
        monkeypatch.setattr(identity.SessionGeneration, "get_by_id", read_then_wait)

        got = []

        def reader():
            with runtime.of(app).context():
                got.append(identity.generation(user_id))
        thread = threading.Thread(target=reader, name="reader")
        thread.start()
        assert read.wait(10)
        assert client.delete("/api/session").status_code == 204  # the sign-out, between the read and the store
        if dropped:
            cache.delete(key)
        resume.set()
        thread.join(10)
        assert got == [identity.NEVER_SIGNED_OUT]  # what it read: the generation from before the sign-out
        _replay(client, saved)
        r = client.get("/api/session")
        assert r.status_code == 401, "a read from before the sign-out was cached after it: the old cookie passes again"
