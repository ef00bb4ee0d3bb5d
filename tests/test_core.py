"""The plumbing: health, sign-in (dev and Google), errors, index enforcement, and the local stack itself."""
import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.api_core import exceptions as core_exceptions
from google.auth import crypt, jwt
from google.cloud import ndb

from core import datastore, identity, runtime, tasks
from core.errors import Unavailable
from core.production_latency import OFF
from core.settings import Settings, dev_signin_on, refuse_dev_signin_off_loopback
from devstack import DevstackError, Stack, services
from devstack.apps import app_on
from devstack.taskqueue import DrainedQueue
from tests.support import ON_APP_ENGINE, at_once, csrf_token, make_app, running, settings_for

REPO = Path(__file__).resolve().parent.parent


def test_healthz(client, stack):
    health = client.get("/healthz").get_json()
    assert health == {"datastore": "ok", "cache": {"backend": stack.cache.backend, "status": "ok"}}


def test_healthz_503_when_datastore_is_down(weak_stack, weak_app):
    client = weak_app.test_client()
    assert client.get("/healthz").status_code == 200
    assert client.post("/api/session", json={"email": "a@example.com", "admin": False}).status_code == 200
    assert client.post("/api/counters/up/increment").status_code == 200
    assert client.get("/api/counters/up").get_json()["count"] == 1  # its config now sits in memcached
    weak_stack.emulator.stop()
    # An outage is not contention: the increment fails at once instead of retrying transaction after transaction.
    start = time.monotonic()
    r = client.post("/api/counters/up/increment")
    assert r.status_code == 503 and r.get_json()["error"]["code"] == "datastore_unavailable"
    assert time.monotonic() - start < 15
    r = client.get("/healthz")
    assert r.status_code == 503 and r.get_json()["datastore"] == "down"
    # An API call then gets a clear 503, not a stack trace.
    r = client.get("/api/counters/x")
    assert r.status_code == 503 and r.get_json()["error"]["code"] == "datastore_unavailable"
    assert "Traceback" not in r.get_data(as_text=True)


def test_session_api(client):
    assert client.get("/api/session").status_code == 401
    r = client.post("/api/session", json={"email": "Ann@Example.com", "admin": True})
    user = r.get_json()["user"]
    assert user["email"] == "ann@example.com" and user["admin"] is True and "|" not in user["id"]
    assert client.get("/api/session").get_json() == {"user": user}
    assert client.delete("/api/session").status_code == 204
    assert client.get("/api/session").status_code == 401


@pytest.mark.parametrize("body", [{"email": "not-an-email"}, {"email": ""}, {"email": "a@b.c" + "x" * 300},
                                  {"email": "a@example.com", "admin": "yes"}, {"admin": True}, {"email": 5},
                                  {"email": "a\ud800@example.com"}, {"email": "a\uffff@example.com"}])
def test_bad_sign_in_is_422(client, body):
    """A lone surrogate (JSON's "\\ud800") was a 500: its user id is a hash of the email's UTF-8 (issue 57)."""
    r = client.post("/api/session", json=body)
    code = "bad_admin" if body.get("admin") == "yes" else "bad_email"
    assert r.status_code == 422 and r.get_json()["error"]["code"] == code
    assert r.get_json()["error"]["message"]
    assert client.get("/api/session").status_code == 401


def test_same_email_same_id(client):
    first = client.post("/api/session", json={"email": "a@example.com"}).get_json()["user"]["id"]
    again = client.post("/api/session", json={"email": "A@example.com"}).get_json()["user"]["id"]
    other = client.post("/api/session", json={"email": "b@example.com"}).get_json()["user"]["id"]
    assert first == again != other


def test_signin_page_and_form(client):
    assert b"Sign in" in client.get("/signin").data
    token = csrf_token(client, "/signin")
    assert client.post("/signin", data={"email": "p@example.com"}).status_code == 400  # no CSRF token
    r = client.post("/signin", data={"csrf_token": token, "email": "p@example.com", "next": "//evil.example/"})
    assert r.status_code == 302 and r.headers["Location"] == "/"
    for sneaky in ("/\t/evil.example", "/\n/evil.example", "/ /evil.example", "/\x00/x"):  # werkzeug drops a tab
        token = csrf_token(client, "/signin")
        r = client.post("/signin", data={"csrf_token": token, "email": "p@example.com", "next": sneaky})
        assert r.status_code == 302 and r.headers["Location"] == "/", (sneaky, r.headers["Location"])
    token = csrf_token(client, "/signin")
    r = client.post("/signin", data={"csrf_token": token, "email": "p@example.com", "next": "/blog/demo?start=3"})
    assert r.headers["Location"] == "/blog/demo?start=3"  # a path on this site still goes where it says
    assert client.get("/api/session").get_json()["user"]["email"] == "p@example.com"
    assert b"p@example.com" in client.get("/counters").data
    # Signing in starts a new session (no fixation), so the old page's token is spent.
    assert client.post("/signout", data={"csrf_token": token}).status_code == 400
    token = csrf_token(client, "/signin")
    r = client.post("/signin", data={"csrf_token": token, "email": "nope"})
    assert r.status_code == 422 and b"valid email" in r.data
    r = client.post("/signin", data={"csrf_token": csrf_token(client, "/signin"), "email": "a\x01\uffff@example.com"})
    assert r.status_code == 422 and b"valid email" in r.data
    assert client.post("/signout", data={"csrf_token": token}).status_code == 302
    assert client.get("/api/session").status_code == 401


def test_html_errors_are_pages_and_api_errors_are_json(client):
    r = client.get("/no/such/page")
    assert r.status_code == 404 and r.content_type.startswith("text/html") and b"There is nothing here" in r.data
    for path in ("/api/no/such/thing", "/api"):
        r = client.get(path)
        assert r.status_code == 404
        assert r.get_json() == {"error": {"code": "not_found", "message": "There is nothing here."}}, path


def test_addresses_a_visitor_guesses_lead_where_they_meant(client):
    for path in ("/tour", "/source", "/source/"):
        r = client.get(path)
        assert r.status_code == 302 and r.headers["Location"] == "/", path
    r = client.get("/comments")
    assert r.status_code == 302 and r.headers["Location"] == "/#lesson-comments"
    assert 'id="lesson-comments"' in client.get("/").get_data(as_text=True)


def test_home_page(client):
    html = client.get("/").get_data(as_text=True)
    assert "Sharded counters" in html and 'href="/counters"' in html


def test_index_yaml_is_enforced(legacy_app):
    """The legacy emulator runs with --require_indexes: a query whose composite index is not in index.yaml fails there
    as in production, so every query the tests run on it is proven to have its index. (The Firestore emulator has no
    such check: under DATASTORE=firestore this test still runs on a legacy emulator.)"""
    class IndexProbe(ndb.Model):
        a = ndb.IntegerProperty()
        b = ndb.IntegerProperty()

    with runtime.current().context():
        IndexProbe(a=1, b=2).put()
        assert len(IndexProbe.query(IndexProbe.a == 1).fetch()) == 1  # built-in single-property index
        with pytest.raises(core_exceptions.GoogleAPICallError) as info:
            IndexProbe.query(IndexProbe.a == 1).order(-IndexProbe.b).fetch()
        assert "index" in str(info.value).lower()


def test_a_query_whose_index_is_not_ready_answers_503_with_retry_after(legacy_stack):
    """After a first deploy, a query whose composite index is still building fails with FailedPrecondition for
    minutes: a 503 with Retry-After, not a 500. The legacy emulator refuses a query whose index is missing the same
    way, so that is how it is met here; an HTML page and a JSON answer alike."""
    class ReadyProbe(ndb.Model):
        a = ndb.IntegerProperty()
        b = ndb.IntegerProperty()

    app = make_app(legacy_stack, checked=False, **legacy_stack.fresh())

    def unindexed():
        ReadyProbe.query(ReadyProbe.a == 1).order(-ReadyProbe.b).fetch()
        return "indexed after all"

    def another_precondition():
        raise core_exceptions.FailedPrecondition("The referenced transaction has expired.")
    app.add_url_rule("/probe", view_func=unindexed)
    app.add_url_rule("/api/probe", endpoint="api_probe", view_func=unindexed)
    app.add_url_rule("/api/other", view_func=another_precondition)
    with running(app):
        client = app.test_client()
        page, answer, other = client.get("/probe"), client.get("/api/probe"), client.get("/api/other")
    for r in (page, answer):
        assert r.status_code == 503 and r.headers["Retry-After"] == "60"
    assert answer.get_json()["error"]["code"] == "index_not_ready"
    assert "index that is not ready" in page.get_data(as_text=True)
    # Any other failed precondition is the app's error: a 500, with no invitation to retry.
    assert other.status_code == 500 and "Retry-After" not in other.headers
    assert other.get_json()["error"]["code"] == "internal"


def test_only_the_caches_own_errors_are_the_cache_down_503(stack):
    """A write of a cached kind while the cache is away is a 503 cache_unavailable; any other OSError (a missing file)
    is the app's error, a 500, not "cache unreachable during a write"."""
    class Cached(ndb.Model):  # a globally cached kind: ndb must lock its cache entry before writing it
        text = ndb.StringProperty()

    app = make_app(stack, checked=False, **stack.fresh())

    def read_a_missing_file():
        return (REPO / "no-such-file.txt").read_text()

    def write_a_cached_kind():
        Cached(id="c", text="t").put()
        return "written"
    app.add_url_rule("/api/missing-file", view_func=read_a_missing_file)
    app.add_url_rule("/api/cached-write", view_func=write_a_cached_kind)
    with running(app):
        client = app.test_client()
        missing = client.get("/api/missing-file")
        stack.cache.stop()
        try:
            away = client.get("/api/cached-write")
        finally:
            stack.cache.start()
    assert missing.status_code == 500 and missing.get_json()["error"]["code"] == "internal"
    assert away.status_code == 503 and away.get_json()["error"]["code"] == "cache_unavailable"


class _WatchedEnvironment(dict):
    """os.environ's copy that remembers every change made to it."""
    changes: list

    def __setitem__(self, name, value):
        self.changes.append(name)
        super().__setitem__(name, value)

    def __delitem__(self, name):
        self.changes.append(name)
        super().__delitem__(name)


@pytest.mark.parametrize("named", ["127.0.0.1:1", None])
def test_the_datastore_client_is_built_without_touching_the_environment(stack, monkeypatch, named):
    """Several apps are built in one process (tests, benchmarks), on threads too: the ndb client reaches the settings'
    emulator without changing os.environ, whatever emulator the environment names (a dead address, or none)."""
    class Plain(ndb.Model):
        text = ndb.StringProperty()

    environment = _WatchedEnvironment({k: v for k, v in os.environ.items() if k != "DATASTORE_EMULATOR_HOST"},
                                      **({"DATASTORE_EMULATOR_HOST": named} if named else {}))
    environment.changes = []
    monkeypatch.setattr(os, "environ", environment)
    settings = settings_for(stack, **stack.fresh())
    client = datastore.make_client(settings, OFF)
    assert environment.changes == []
    assert client.host == settings.emulator_host != "127.0.0.1:1"
    with client.context():
        key = Plain(id="p", text="written").put()
        assert key.get(use_cache=False, use_global_cache=False).text == "written"


def test_the_warmup_request_answers(client):
    r = client.get("/_ah/warmup")
    assert r.status_code == 200 and r.get_data() == b""
    assert "1 Lookup" in r.headers["Server-Timing"]  # it reached Datastore, which opened this process's channel


def test_a_task_asked_to_retry_is_not_read_as_a_congested_queue(client, app):
    """Cloud Tasks slows a whole queue on a 503 from an App Engine target. A task that met contention or an index
    still building answers 500 instead (and without Retry-After); Datastore away stays a 503, as on every route."""
    def contended(payload, attempt):
        raise Unavailable("Contention outlasted the retries; try again.")

    def index_building(payload, attempt):
        raise core_exceptions.FailedPrecondition("The query requires an index that is not ready.")

    def datastore_away(payload, attempt):
        raise core_exceptions.ServiceUnavailable("Datastore did not answer.")
    for fn in (contended, index_building, datastore_away):
        runtime.of(app).tasks.register(f"test.{fn.__name__}", fn)
    token = {tasks.TOKEN_HEADER: tasks.local_token(runtime.of(app).settings.secret_key)}
    answers = {name: client.post(f"/api/tasks/test.{name}", json={}, headers=token)
               for name in ("contended", "index_building", "datastore_away")}
    assert {name: (r.status_code, r.get_json()["error"]["code"]) for name, r in answers.items()} == {
        "contended": (500, "unavailable"), "index_building": (500, "index_not_ready"),
        "datastore_away": (503, "datastore_unavailable")}
    assert "Retry-After" not in answers["index_building"].headers


# --- identity on App Engine: Sign in with Google ----------------------------------------------------------------------

CLIENT_ID = ON_APP_ENGINE["GOOGLE_CLIENT_ID"]


@pytest.fixture(scope="module")
def google_key():
    """A signer and its public key standing in for Google's (which sign only Google's tokens): RS256, as Google's."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    return crypt.RSASigner.from_string(pem, "test-kid"), {"test-kid": public.decode()}


def _google_token(signer, **claims):
    """An ID token as Sign in with Google hands the browser one, for `claims` over a valid set."""
    now = int(time.time())
    payload = {"iss": "https://accounts.google.com", "aud": CLIENT_ID, "azp": CLIENT_ID, "sub": "1234",
               "email": "boss@example.com", "email_verified": True, "hd": "example.com", "iat": now, "exp": now + 600}
    payload.update(claims)
    return jwt.encode(signer, {k: v for k, v in payload.items() if v is not None}).decode()


class StaticKeys:
    """Google's published keys, here the test's own (GoogleKeys fetches the real ones)."""

    def __init__(self, keys):
        self.keys = keys

    def get(self):
        return self.keys


def _gae_app(stack, google_key, **env):
    app = app_on(stack, task_queue=DrainedQueue(), **stack.emulator.fresh(), **ON_APP_ENGINE, **env)
    app.extensions["google_keys"] = StaticKeys(google_key[1])
    return app


def _https_client(app):
    """A browser on App Engine's https URL: the session cookie is Secure there."""
    client = app.test_client()
    client.environ_base["wsgi.url_scheme"] = "https"
    return client


@pytest.fixture
def gae_client(stack, google_key):
    with running(_gae_app(stack, google_key, ADMIN_EMAILS="boss@example.com")) as app:
        yield _https_client(app)


def test_on_app_engine_readers_read_writers_write_and_admins_administer(gae_client, google_key):
    signer = google_key[0]
    # A reader: every page, no sign-in; a link to sign in; writing refused.
    assert gae_client.get("/").status_code == 200
    page = gae_client.get("/counters").get_data(as_text=True)
    assert 'href="/signin?next=/counters"' in page
    assert gae_client.get("/api/session").status_code == 401
    assert gae_client.put("/api/counters/x", json={"mode": "general"}).status_code == 401
    signin = gae_client.get("/signin")
    html, csp = signin.get_data(as_text=True), signin.headers["Content-Security-Policy"]
    assert f'data-client_id="{CLIENT_ID}"' in html and 'name="email"' not in html  # Google's button, no dev form
    assert "https://accounts.google.com/gsi/client" in csp and "frame-src https://accounts.google.com/gsi/" in csp
    assert "accounts.google.com" not in gae_client.get("/").headers["Content-Security-Policy"]  # that page only
    # An admin (in ADMIN_EMAILS), signed in through the page's form as static/js/signin.js posts it.
    r = gae_client.post("/signin", data={"credential": _google_token(signer), "next": "/counters",
                                         "csrf_token": csrf_token(gae_client, "/signin")})
    assert r.status_code == 302 and r.headers["Location"] == "/counters"
    assert gae_client.get("/api/session").get_json()["user"] == {
        "id": "google:1234", "email": "boss@example.com", "admin": True}
    assert gae_client.put("/api/counters/x", json={"mode": "general"}).status_code == 200
    assert gae_client.post("/api/blogs/news/entries", json={"title": "t", "body": "b"}).status_code == 201
    # A writer: anyone Google vouches for, signed in through the API; writes, but administers nothing.
    writer = _https_client(gae_client.application)
    r = writer.post("/api/session", json={"credential": _google_token(signer, sub="9", email="U@Example.com")})
    assert r.status_code == 200 and r.get_json()["user"] == {"id": "google:9", "email": "u@example.com",
                                                             "admin": False}
    assert writer.post("/api/blogs/news/entries/0/comments", json={"text": "hello"}).status_code == 201
    assert writer.put("/api/counters/y", json={"mode": "general"}).status_code == 403
    assert writer.post("/api/blogs/news/entries", json={"title": "t", "body": "b"}).status_code == 403
    assert writer.delete("/api/session").status_code == 204 and writer.get("/api/session").status_code == 401


def test_an_admin_taken_out_of_admin_emails_is_no_admin_at_their_next_request(stack, google_key, gae_client):
    assert gae_client.post("/api/session", json={"credential": _google_token(google_key[0])}).status_code == 200
    cookie = gae_client.get_cookie("session", domain="localhost")
    with running(_gae_app(stack, google_key, ADMIN_EMAILS="other@example.com")) as redeployed:
        client = _https_client(redeployed)
        client.set_cookie("session", cookie.value, domain="localhost", secure=True)
        assert client.get("/api/session").get_json()["user"]["admin"] is False
        assert client.put("/api/counters/x", json={"mode": "general"}).status_code == 403


# Each claim wrong in turn, the times relative to when the test runs (not to when pytest collected it)
BAD_CLAIMS = {
    "another app's": lambda now: {"aud": "999-other.apps.googleusercontent.com"},
    "another issuer's": lambda now: {"iss": "https://evil.example"},
    "expired": lambda now: {"exp": now - 3600, "iat": now - 7200},
    "an address Google has not verified": lambda now: {"email_verified": False},
    "no word on the address": lambda now: {"email_verified": None},
    "no address": lambda now: {"email": None},
    "no user": lambda now: {"sub": None},
    "issued 5 minutes ahead (the leeway is 10 s)": lambda now: {"iat": now + 300, "exp": now + 900},
    "minted by someone else for a non-admin": lambda now: {
        "azp": "117000000000000000001", "email": "bot@x.iam.gserviceaccount.com", "hd": None},
}


@pytest.mark.parametrize("claims", BAD_CLAIMS.values(), ids=BAD_CLAIMS.keys())
def test_bad_google_tokens_sign_nobody_in(gae_client, google_key, claims):
    token = _google_token(google_key[0], **claims(int(time.time())))
    r = gae_client.post("/api/session", json={"credential": token})
    assert r.status_code == 401 and r.get_json()["error"]["code"] == "bad_credential"
    assert gae_client.get("/api/session").status_code == 401


def test_whose_address_is_an_admins_is_for_google_to_vouch(gae_client, google_key):
    """An address in ADMIN_EMAILS makes an admin only where it is the account's own: a Workspace account of its domain
    (`hd`), Gmail, or a Google service account; a personal account merely verified on that address is a writer."""
    signer = google_key[0]
    signed_in = gae_client.post("/api/session", json={"credential": _google_token(signer, hd=None)})
    assert signed_in.status_code == 200 and signed_in.get_json()["user"]["admin"] is False
    assert gae_client.get("/api/session").get_json()["user"]["admin"] is False
    assert gae_client.put("/api/counters/x", json={"mode": "general"}).status_code == 403
    other_domain = gae_client.post("/api/session", json={"credential": _google_token(signer, hd="evil.example")})
    assert other_domain.get_json()["user"]["admin"] is False
    assert gae_client.post("/api/session", json={"credential": _google_token(signer)}).get_json()["user"]["admin"]


def test_a_token_minted_for_an_admin_service_account_signs_it_in(stack, google_key):
    """make load --token: `gcloud auth print-identity-token --impersonate-service-account` mints a token whose `azp`
    is the account's id, not the app's client; taken from an admin (Google's own service-account address) only."""
    robot = "load@demo.iam.gserviceaccount.com"
    with running(_gae_app(stack, google_key, ADMIN_EMAILS=robot)) as app:
        client = _https_client(app)
        token = _google_token(google_key[0], azp="117000000000000000001", sub="117000000000000000001", email=robot,
                              hd=None)
        r = client.post("/api/session", json={"credential": token})
        assert r.status_code == 200 and r.get_json()["user"]["admin"] is True


def _other_key(kid):
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return crypt.RSASigner.from_string(pem, kid)


def _with_header(alg):
    """A token whose body is valid and whose header names `alg` and the test key's id, its signature none."""
    now = int(time.time())
    body = {"iss": "accounts.google.com", "aud": CLIENT_ID, "azp": CLIENT_ID, "sub": "1", "iat": now, "exp": now + 60,
            "email": "boss@example.com", "email_verified": True}

    def part(value):
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return ".".join((part({"alg": alg, "kid": "test-kid", "typ": "JWT"}), part(body), part("signature")))


def test_tokens_google_would_not_sign_are_refused(gae_client, google_key):
    """An unknown key id, and a token signed with HS256 (a shared secret) or with no algorithm at all."""
    for credential in (_google_token(_other_key("other-kid")), _with_header("HS256"), _with_header("none")):
        assert gae_client.post("/api/session", json={"credential": credential}).status_code == 401
    # Google's older spelling of its issuer is Google's too
    assert gae_client.post("/api/session", json={
        "credential": _google_token(google_key[0], iss="accounts.google.com")}).status_code == 200


def test_a_sign_in_lasts_twelve_hours(gae_client, google_key, monkeypatch):
    """Flask checks a session cookie's signing time: one signed 13 hours ago is nobody's, one of 11 hours still works.
    An outer bound only: the sign-in's own time and sign-out end a cookie sooner (tests/test_sessions.py)."""
    from itsdangerous.timed import TimestampSigner
    assert gae_client.post("/api/session", json={"credential": _google_token(google_key[0])}).status_code == 200
    app = gae_client.application
    serializer = app.session_interface.get_signing_serializer(app)
    session_data = serializer.loads(gae_client.get_cookie("session", domain="localhost").value)
    for hours, status in ((13, 401), (11, 200)):
        monkeypatch.setattr(TimestampSigner, "get_timestamp", lambda self, h=hours: int(time.time()) - h * 3600)
        signed = serializer.dumps(session_data)
        monkeypatch.undo()
        gae_client.set_cookie("session", signed, domain="localhost", secure=True)
        assert gae_client.get("/api/session").status_code == status, hours


def test_the_google_sign_in_form_needs_its_csrf_token(gae_client, google_key):
    r = gae_client.post("/signin", data={"credential": _google_token(google_key[0])})
    assert r.status_code == 400 and gae_client.get("/api/session").status_code == 401


def test_a_dev_sign_ins_cookie_is_nobody_where_there_is_no_dev_sign_in(stack, gae_client):
    """The same SECRET_KEY on a local app and a deployment would make the local cookie valid there: it counts only
    where the dev sign-in exists."""
    with running(app_on(stack, SECRET_KEY=ON_APP_ENGINE["SECRET_KEY"], DEV_SIGNIN="on")) as local:
        client = local.test_client()
        assert client.post("/api/session", json={"email": "x@example.com", "admin": True}).status_code == 200
        cookie = client.get_cookie("session", domain="localhost")
    gae_client.set_cookie("session", cookie.value, domain="localhost", secure=True)
    assert gae_client.get("/api/session").status_code == 401
    assert gae_client.put("/api/counters/x", json={"mode": "general"}).status_code == 401


def test_forged_google_tokens_sign_nobody_in(gae_client, google_key):
    for credential in (_google_token(_other_key("test-kid")), "garbage", 123, "",
                       "x" * 5000):
        r = gae_client.post("/api/session", json={"credential": credential})
        assert r.status_code == 401, credential
    r = gae_client.post("/signin", data={"credential": "garbage", "csrf_token": csrf_token(gae_client, "/signin")})
    assert r.status_code == 401 and "could not be verified" in r.get_data(as_text=True)
    assert gae_client.get("/api/session").status_code == 401


def test_the_app_will_not_start_on_app_engine_without_its_sign_in(tmp_path):
    """One log line that says what to set, and gunicorn's "worker failed to boot" exit status, not a traceback."""
    env = {"PATH": os.environ["PATH"], **ON_APP_ENGINE, "GOOGLE_CLIENT_ID": ""}
    done = subprocess.run([sys.executable, "-c", "import main; main.app"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Not starting: GOOGLE_CLIENT_ID must be set on App Engine" in lines[0], lines


def test_dev_sign_in_does_not_exist_on_app_engine(gae_client):
    r = gae_client.post("/api/session", json={"email": "x@example.com", "admin": True})
    assert r.status_code == 404
    assert gae_client.get("/api/session").status_code == 401


def test_app_engine_needs_a_secret_key():
    with pytest.raises(RuntimeError, match="SECRET_KEY"):
        Settings.from_env({"GAE_ENV": "standard"})


@pytest.mark.parametrize("where", [ON_APP_ENGINE, {"K_SERVICE": "app"}, {}])
def test_a_secret_key_set_directly_holds_at_least_32_bytes(where):
    """Issue 57: a SECRET_KEY set directly had no minimum (Secret Manager's had one). Counted in bytes: "é" is two.
    Local development (an emulator) takes any: its default key is public anyway."""
    for short in ("s", "x" * 31, "é" * 15 + "x"):
        with pytest.raises(RuntimeError, match=f"SECRET_KEY holds {len(short.encode())} bytes: a session key needs at "
                                               "least 32"):
            Settings.from_env({**where, "SECRET_KEY": short})
    for enough in ("x" * 32, "é" * 16):
        assert Settings.from_env({**where, "SECRET_KEY": enough}).secret_key == enough
    assert Settings.from_env({"DATASTORE_EMULATOR_HOST": "127.0.0.1:8081", "SECRET_KEY": "s"}).secret_key == "s"


def test_the_dev_sign_in_and_the_dev_secret_are_for_local_development_only():
    """Off App Engine standard is not local development: Cloud Run, flex or a VM need their own secret, and never get
    the dev sign-in (anyone in as an admin) even when asked; locally it is there only when asked for."""
    for elsewhere in ({}, {"GAE_ENV": "flex"}, {"K_SERVICE": "app"}):
        with pytest.raises(RuntimeError, match="outside local development"):
            Settings.from_env(elsewhere)
        assert not Settings.from_env({**elsewhere, "SECRET_KEY": "s" * 32, "DEV_SIGNIN": "on"}).dev_signin
    local = {"DATASTORE_EMULATOR_HOST": "127.0.0.1:8081"}
    assert not Settings.from_env(local).dev_signin  # not asked for
    assert Settings.from_env({**local, "DEV_SIGNIN": "on"}).dev_signin
    assert not Settings.from_env({**local, "DEV_SIGNIN": "on", **ON_APP_ENGINE}).dev_signin


def test_without_the_dev_sign_in_nobody_signs_in_that_way(stack):
    """An app whose settings leave the dev sign-in off and set no Google client: no form, no API, no link to them."""
    with running(app_on(stack, DEV_SIGNIN="off", SECRET_KEY="s")) as app:
        client = app.test_client()
        assert client.post("/api/session", json={"email": "x@example.com", "admin": True}).status_code == 404
        assert client.get("/signin").status_code == 404 and client.get("/api/session").status_code == 401
        assert b"Sign in" not in client.get("/counters").data


# --- the local stack ------------------------------------------------------------------------------------------------

def test_a_second_stack_does_not_clash(stack):
    with Stack() as second:
        assert second.emulator.port != stack.emulator.port
        assert second.cache.port != stack.cache.port
        assert second.emulator.healthy() and stack.emulator.healthy()
    assert not second.emulator.healthy() and second.emulator.proc is None
    assert stack.emulator.healthy() and stack.cache.healthy()


def test_missing_java_is_one_clear_sentence(monkeypatch):
    monkeypatch.setattr(services.shutil, "which", lambda name: None)
    with pytest.raises(DevstackError, match="Java 11 or newer is needed"):
        services.emulator_command()
    with pytest.raises(DevstackError, match="Java 11 or newer is needed"):
        services.firestore_command()


def test_missing_sdk_is_one_clear_sentence(monkeypatch, tmp_path):
    monkeypatch.setattr(services.shutil, "which", lambda name: "/usr/bin/java" if name == "java" else None)
    monkeypatch.setenv("CLOUDSDK_ROOT", str(tmp_path))
    monkeypatch.setattr(services, "SDK_FALLBACKS", ())
    with pytest.raises(DevstackError, match="install the Google Cloud CLI.*cloud-datastore-emulator"):
        services.emulator_command()
    with pytest.raises(DevstackError, match="install the Google Cloud CLI.*cloud-firestore-emulator"):
        services.firestore_command()


def test_settings_parse_memcached_hosts_and_admins():
    s = Settings.from_env({"MEMCACHED_HOSTS": "10.0.0.1:11211, 10.0.0.2:11211", "ADMIN_EMAILS": "A@x.com, b@y.org",
                           "SECRET_KEY": "s" * 32})
    assert s.memcached_hosts == ("10.0.0.1:11211", "10.0.0.2:11211")
    assert s.admin_emails == {"a@x.com", "b@y.org"}


def test_unreachable_google_keys_are_503_only_for_those_signing_in(gae_client, google_key):
    from devstack import free_port
    gae_client.application.extensions["google_keys"] = identity.GoogleKeys(url=f"http://127.0.0.1:{free_port()}/k")
    assert gae_client.get("/api/session").status_code == 401  # no token: no fetch, simply not signed in
    assert gae_client.get("/").status_code == 200
    r = gae_client.post("/api/session", json={"credential": _google_token(google_key[0])})
    assert r.status_code == 503 and r.get_json()["error"]["code"] == "google_keys_unavailable"


def test_contention_is_told_from_an_outage():
    from core.transactions import is_contention
    aborted = core_exceptions.Aborted("too much contention on these datastore entities")
    assert is_contention(aborted) and is_contention(core_exceptions.Unknown("?"))
    # ndb retries an RPC itself, then wraps the last error: what counts is that error.
    assert is_contention(core_exceptions.RetryError("3 retries", aborted))
    assert not is_contention(core_exceptions.RetryError("3 retries", core_exceptions.ServiceUnavailable("down")))
    assert not is_contention(core_exceptions.ServiceUnavailable("down")) and not is_contention(ValueError())


def test_the_retry_loop_waits_between_attempts_only_and_raises_anything_but_contention_at_once():
    from core.transactions import retried
    waits, tries = [], []

    def collides():
        tries.append(1)
        raise core_exceptions.Aborted("contention")
    with pytest.raises(Unavailable, match="busy"):
        retried(collides, waits.append, max_attempts=3, busy_message="busy")
    assert len(tries) == 3 and waits == [0, 1]  # no wait after the last attempt: the 503 comes at once
    waits.clear()
    with pytest.raises(ValueError):
        retried(lambda: int("x"), waits.append)
    assert waits == []
    assert retried(_fails_then_commits(core_exceptions.Unknown("?")), waits.append) == "done" and waits == [0]


def _fails_then_commits(error):
    """An attempt that raises `error` the first time and answers "done" the next."""
    answers = iter([error, "done"])

    def attempt():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return attempt


@pytest.mark.parametrize("error", [core_exceptions.DeadlineExceeded("not answered in time"),
                                   core_exceptions.ServiceUnavailable("connection dropped")])
def test_a_commit_whose_fate_is_unknown_is_tried_again_a_few_times_then_raised(error):
    """DEADLINE_EXCEEDED and UNAVAILABLE may follow a commit that applied: the loop tries the same call again (whose
    stamp tells it what it finds), up to MAYBE_APPLIED_ATTEMPTS in all, then raises the error (a 503), so a Datastore
    that is away is a 503 after a few tries, not after the contention budget. ndb's RetryError (it retried already)
    is raised at once."""
    from core.transactions import MAYBE_APPLIED_ATTEMPTS, retried
    waits, tries = [], []
    assert retried(_fails_then_commits(error), waits.append) == "done" and waits == [0]

    def never_answered():
        tries.append(1)
        raise error
    waits.clear()
    with pytest.raises(type(error)):
        retried(never_answered, waits.append)
    assert len(tries) == MAYBE_APPLIED_ATTEMPTS == 3 and waits == [0, 1]
    waits.clear()
    with pytest.raises(core_exceptions.RetryError):
        retried(lambda: (_ for _ in ()).throw(core_exceptions.RetryError("3 retries", error)), waits.append)
    assert waits == []


def test_a_port_taken_before_the_bind_is_chosen_again(monkeypatch):
    import socket

    from devstack.services import Memcached
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    ports = iter([taken])  # the first "free" port is taken by the time memcached binds it, as in the race
    real_free_port = services.free_port
    monkeypatch.setattr(services, "free_port", lambda: next(ports, None) or real_free_port())
    server = Memcached()
    try:
        server.start()
        assert server.port != taken and server.healthy()
    finally:
        server.stop()
        squatter.close()
    fixed = Memcached(port=taken)  # a port the caller fixed is not changed behind its back
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", taken))
    squatter.listen()
    try:
        with pytest.raises(services.PortTaken):
            fixed.start()
    finally:
        squatter.close()


class KeyServer:
    """Google's key endpoint stand-in on loopback: answers after `delay` seconds with `status` and the keys; counts
    the fetches."""

    def __init__(self, delay=0.0, status=200):
        import http.server
        import threading

        from devstack import free_port
        self.delay, self.status, self.fetches = delay, status, 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.fetches += 1
                time.sleep(server.delay)
                body = b'{"kid-1": "-----BEGIN PUBLIC KEY-----"}'
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/keys"

    def stop(self):
        self.httpd.shutdown()


def _each(fn):
    """fn's result, or the exception it raised: what each caller got."""
    def call(_):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - the test looks at what each caller got
            return e
    return call


def test_google_keys_are_fetched_once_at_a_time_and_kept_while_a_refresh_fails():
    """Four requests needing the keys at once make one fetch; a failing fetch answers them all at once (it used to
    hold a lock across each one's 5 s timeout in turn: 5, 10, 15, 20 s); keys already held outlive a failed refresh."""
    slow_failure = KeyServer(delay=1.0, status=500)
    try:
        keys = identity.GoogleKeys(url=slow_failure.url, retry_after=30)
        answers = at_once(4, _each(keys.get))
        assert all(isinstance(result, requests.RequestException) for result, _ in answers), answers
        assert slow_failure.fetches == 1 and max(seconds for _, seconds in answers) < 1.9, answers
    finally:
        slow_failure.stop()
    server = KeyServer(delay=0.3)
    try:
        keys = identity.GoogleKeys(url=server.url, lifetime=0.5, retry_after=30)
        answers = at_once(4, _each(keys.get))
        assert [result for result, _ in answers] == [{"kid-1": "-----BEGIN PUBLIC KEY-----"}] * 4
        assert server.fetches == 1
        server.status = 503
        time.sleep(0.6)  # the keys are due for a refresh, which fails
        assert keys.get() == {"kid-1": "-----BEGIN PUBLIC KEY-----"} and server.fetches == 2
        assert keys.get() and server.fetches == 2  # no new try before retry_after
    finally:
        server.stop()


def test_the_dev_sign_in_is_never_served_off_loopback():
    """Issue 75: with the dev sign-in on and the app bound to anything but loopback, TRUSTED_HOSTS does not help (a
    client elsewhere sends `Host: 127.0.0.1`). gunicorn's master refuses before it binds, saying why; loopback, a unix
    socket, or no dev sign-in start as before."""
    local = {"DATASTORE_EMULATOR_HOST": "127.0.0.1:1", "DEV_SIGNIN": "on"}
    assert dev_signin_on(local) is Settings.from_env(local).dev_signin is True
    for bind in ("127.0.0.1:8080", "[::1]:8080", "localhost:8080", "unix:/tmp/app.sock"):
        refuse_dev_signin_off_loopback(True, [bind])
    for bind in ("0.0.0.0:8080", ":8080", "[::]:8080", "192.0.2.7:8080", "app.example:8080"):
        with pytest.raises(RuntimeError, match="DEV_SIGNIN"):
            refuse_dev_signin_off_loopback(True, ["127.0.0.1:8080", bind])
    refuse_dev_signin_off_loopback(False, ["0.0.0.0:8080"])
    # App Engine (app.yaml: GAE_ENV standard, SECRET_KEY_SECRET, port 8080 on every interface) starts: the hook needs
    # nothing of the settings but whether the dev sign-in is on, which it never is there.
    app_engine = {"GAE_ENV": "standard", "SECRET_KEY_SECRET": "app-secret-key", "DEV_SIGNIN": "on"}
    assert dev_signin_on(app_engine) is False
    # The real gunicorn with gunicorn.conf.py, as `make run` and App Engine start it (serving the standard library's
    # demo WSGI app: the hook is the master's, whatever it serves, and the app's own start is not under test here):
    # with the dev sign-in it stops before binding anything; with App Engine's environment it boots its worker.
    command = [sys.executable, "-m", "gunicorn", "--bind", "0.0.0.0:0", "wsgiref.simple_server:demo_app"]
    repo = Path(__file__).parent.parent
    done = subprocess.run(command, env={**os.environ, **local, "GAE_ENV": ""}, capture_output=True, text=True,
                          timeout=60, cwd=repo)
    assert done.returncode == 3 and "listen on '0.0.0.0:0'" in done.stderr, done.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "DATASTORE_EMULATOR_HOST"} | app_engine
    command[command.index("0.0.0.0:0")] = "127.0.0.1:0"  # started for real: loopback
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, cwd=repo) as server:
        try:
            said = [server.stderr.readline() for _ in range(4)]  # starting, listening, using worker, booting
        finally:
            server.terminate()
    assert any("Booting worker" in line for line in said), said
