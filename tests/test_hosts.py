"""The Host a request names: only the app's own names are answered (TRUSTED_HOSTS), and a refused or malformed one
gets the app's own 400 (a page with its security headers, or the API's JSON error), never a bare 500."""
import pytest

from core import settings
from tests.support import ON_APP_ENGINE

BAD_HOSTS = ["x" * 64 + ".example", "a b", "evil.example", "LOCALHOST.evil.example:8080"]
PATHS = ["/", "/blog/news", "/blog/news/feed.atom", "/nope", "/api/counters"]


def test_a_rebound_name_cannot_sign_in(client):
    """DNS rebinding: another site's name pointed at 127.0.0.1; its page's requests are same-origin to the browser."""
    r = client.post("/api/session", json={"email": "boss@example.com", "admin": True},
                    headers={"Host": "evil.example", "Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "bad_host"
    assert "Set-Cookie" not in r.headers
    assert client.get("/api/session").status_code == 401


@pytest.mark.parametrize("host", BAD_HOSTS)
@pytest.mark.parametrize("path", PATHS)
def test_a_bad_host_gets_the_apps_400_with_its_headers(app, client, auth, host, path):
    auth.admin()
    assert client.post("/api/blogs/news/entries", json={"title": "t", "body": "b"}).status_code == 201
    client.get("/blog/news/feed.atom")  # cached: a cached page is refused to a bad host as any other
    auth.sign_out()
    r = app.test_client().get(path, headers={"Host": host})
    assert r.status_code == 400, r.get_data(as_text=True)[:300]
    assert r.headers["X-Frame-Options"] == "DENY" and "default-src 'self'" in r.headers["Content-Security-Policy"]
    if path.startswith("/api/"):
        assert r.get_json()["error"]["code"] == "bad_host"
    else:
        html = r.get_data(as_text=True)
        assert "does not answer to that host name" in html and 'href="/counters"' in html  # the whole page
        assert host not in html


@pytest.mark.parametrize("host", ["x" * 64 + ".example", "a b"])
@pytest.mark.parametrize("path", PATHS)
def test_any_host_allowed_a_malformed_one_is_never_a_500(app, host, path):
    """Where every name is taken (App Engine without TRUSTED_HOSTS), Werkzeug refuses a name it cannot encode
    (BadHost: a label over 63 characters) before it builds a URL adapter, and the error page is built without one
    (400); a name with a space it reads as no name at all, and the page is served."""
    app.config["TRUSTED_HOSTS"] = None
    r = app.test_client().get(path, headers={"Host": host})
    assert r.status_code == (400 if " " not in host else 404 if path == "/nope" or "news" in path else 200), \
        r.get_data(as_text=True)[:300]
    assert "default-src 'self'" in r.headers["Content-Security-Policy"]
    if r.status_code == 400 and path.startswith("/api/"):
        assert r.get_json()["error"]["code"] == "bad_host"  # the name refused, said as for any refused name


def test_the_loopback_names_are_answered(client):
    for host in ("localhost", "127.0.0.1", "127.0.0.1:8080", "localhost:5000"):
        assert client.get("/api/counters", headers={"Host": host}).status_code == 200, host


def test_trusted_hosts_from_the_environment():
    local = {"DATASTORE_EMULATOR_HOST": "127.0.0.1:1"}
    assert settings.Settings.from_env(local).trusted_hosts == settings.LOCAL_HOSTS
    assert settings.Settings.from_env(local).canonical_url_root == "http://localhost"
    deployed = settings.Settings.from_env({**ON_APP_ENGINE, "GOOGLE_CLOUD_PROJECT": "demo",
                                           "TRUSTED_HOSTS": "www.example.com, .example.com"})
    assert deployed.trusted_hosts == ("www.example.com", ".example.com")
    assert deployed.canonical_url_root == "https://www.example.com"
    unset = settings.Settings.from_env({**ON_APP_ENGINE, "GOOGLE_CLOUD_PROJECT": "demo"})
    assert unset.trusted_hosts == () and unset.canonical_host == "demo.appspot.com"
    for bad in (".example.com", "www.example.com:443", "a b", "evil.example/x"):
        with pytest.raises(RuntimeError, match="TRUSTED_HOSTS"):
            settings.Settings.from_env({**local, "TRUSTED_HOSTS": bad})
