"""The blog over HTTP: the JSON API, the pages, the admin form, the feed."""
import json
import re
import xml.etree.ElementTree as ET
import zlib

import pytest
from google.cloud import ndb

from blog import service
from blog.entries import entry_dict
from blog.models import BlogEntry, BlogIndex, EntryRef, PostMarker
from blog.views import ENTRY_BODY_BYTES
from core import runtime
from tests.support import billed, csrf_token


def _stored(kind):
    with runtime.current().context():
        return kind.query().fetch(keys_only=True)


def _post(client, blog="news", title="Hello", body="Some *text*", **kw):
    return client.post(f"/api/blogs/{blog}/entries", json={"title": title, "body": body}, **kw)


def test_post_then_read(client, auth):
    auth.admin()
    r = _post(client)
    assert r.status_code == 201, r.get_data(as_text=True)
    entry = r.get_json()
    assert (entry["index"], entry["title"], entry["body"], entry["author"]) == (0, "Hello", "Some *text*",
                                                                                "boss")  # a name, not the email
    assert entry["created"].endswith("Z") and r.headers["Location"].endswith("/api/blogs/news/entries/0")
    assert _post(client, title="Second").get_json()["index"] == 1
    page = client.get("/api/blogs/news/entries").get_json()
    assert [e["index"] for e in page["entries"]] == [1, 0] and page["next"] is None
    got = client.get("/api/blogs/news/entries/0").get_json()
    assert got["title"] == "Hello" and got["body_html"] == "<p>Some <em>text</em></p>" and got["views"] == 0
    assert client.get("/api/blogs").get_json() == {"blogs": [{"name": "news", "entries": 2}]}


def test_paging_over_the_api(client, auth):
    auth.admin()
    for i in range(7):
        assert _post(client, title=f"t{i}").status_code == 201
    first = client.get("/api/blogs/news/entries?limit=3").get_json()
    assert [e["index"] for e in first["entries"]] == [6, 5, 4] and first["next"] == 3
    second = client.get(f"/api/blogs/news/entries?limit=3&start={first['next']}").get_json()
    assert [e["index"] for e in second["entries"]] == [3, 2, 1] and second["next"] == 0
    last = client.get("/api/blogs/news/entries?limit=3&start=0").get_json()
    assert [e["index"] for e in last["entries"]] == [0] and last["next"] is None


def test_the_blog_page_says_which_entries_it_shows_of_how_many(client, auth):
    auth.admin()
    assert _post(client, title="only").status_code == 201

    def said():
        html = client.get("/blog/news").get_data(as_text=True)
        return " ".join(re.search(r'<p class="src">(.*?)·', html, re.S)[1].split())
    assert said() == "Entries 0&ndash;0 (by index, from 0) of 1 entry"
    for i in range(11):
        assert _post(client, title=f"t{i}").status_code == 201
    assert said() == "Entries 2&ndash;11 (by index, from 0) of 12 entries"


def test_unknown_blog_and_entry_are_404(client, auth):
    assert client.get("/api/blogs/nope/entries").status_code == 404
    assert client.get("/api/blogs/nope/entries/0").status_code == 404
    assert client.get("/blog/nope").status_code == 404
    auth.admin()
    _post(client)
    r = client.get("/api/blogs/news/entries/5")
    assert r.status_code == 404 and r.get_json()["error"]["code"] == "no_such_entry"
    assert client.get("/blog/news/5").status_code == 404


@pytest.mark.parametrize("query,code", [
    ("start=-1", "bad_start"), ("start=abc", "bad_start"), ("start=1.5", "bad_start"),
                                        ("start=99999999999", "bad_start"), ("limit=0", "bad_limit"),
                                        ("limit=51", "bad_limit"), ("limit=x", "bad_limit")])
def test_bad_paging_parameters_are_400(client, auth, query, code):
    auth.admin()
    _post(client)
    r = client.get(f"/api/blogs/news/entries?{query}")
    assert r.status_code == 400 and r.get_json()["error"]["code"] == code
    if query.startswith("start"):  # the page has a fixed size
        assert client.get(f"/blog/news?{query}").status_code == 400


def test_posting_needs_an_admin(client, auth):
    assert _post(client).status_code == 401
    auth.sign_in("reader@example.com")
    r = _post(client)
    assert r.status_code == 403 and r.get_json()["error"]["code"] == "forbidden"
    assert _stored(BlogIndex) == [] and _stored(BlogEntry) == []


@pytest.mark.parametrize("data,status,code", [
    ({"title": "x" * 201, "body": "b"}, 422, "bad_title"),
    ({"title": "", "body": "b"}, 422, "bad_title"),
    ({"title": "   ", "body": "b"}, 422, "bad_title"),
    ({"title": "two\nlines", "body": "b"}, 422, "bad_title"),
    ({"title": "t", "body": "x" * 100_001}, 422, "bad_body"),
    ({"title": "t", "body": ""}, 422, "bad_body"),
    ({"title": "t", "body": " \n "}, 422, "bad_body"),
    ({"title": "t", "body": "nul \x00 byte"}, 422, "bad_body"),
    ({"title": 5, "body": "b"}, 422, "bad_title"),
    ({"body": "b"}, 422, "bad_title"),
    ({"title": "t", "body": ["b"]}, 422, "bad_body"),
    # What XML 1.0 or UTF-8 cannot carry (issue 57): a lone surrogate was a 500 at the write, a noncharacter broke the
    # feed. Each is a 422 naming the field, before anything is written.
    ({"title": "t\ud800", "body": "b"}, 422, "bad_title"),
    ({"title": "broken \uffff feed", "body": "b"}, 422, "bad_title"),
    ({"title": "t", "body": "a \udfff b"}, 422, "bad_body"),
    ({"title": "t", "body": "a \ufffe b"}, 422, "bad_body"),
    ({"title": "t", "body": "a \ufdd0 b"}, 422, "bad_body"),
    ({"title": "t", "body": "a \U0010ffff b"}, 422, "bad_body"),
    ({"title": "t", "body": "escape \x1b[31m"}, 422, "bad_body"),
    ({"title": "t", "body": "C1 \x85 control"}, 422, "bad_body"),
])
def test_bad_posts_are_4xx_and_consume_no_index(client, auth, data, status, code):
    auth.admin()
    assert _post(client, title="first").status_code == 201
    r = client.post("/api/blogs/news/entries", json=data)
    assert r.status_code == status and r.get_json()["error"]["code"] == code
    assert len(_stored(BlogEntry)) == 1 and len(_stored(PostMarker)) == 1
    assert _post(client, title="next").get_json()["index"] == 1  # the rejected post consumed no index


def test_bad_blog_names_bodies_and_keys_write_nothing(client, auth):
    auth.admin()
    for name in ["UPPER", "under_score", "x" * 65, "s%20p"]:
        r = _post(client, blog=name)
        assert r.status_code == 400 and r.get_json()["error"]["code"] == "bad_blog"
    assert client.post("/api/blogs/news/entries", data="title=x", content_type="application/x-www-form-urlencoded"
                       ).status_code == 415
    assert client.post("/api/blogs/news/entries", data="[1]", content_type="application/json").status_code == 400
    # Bytes that are not UTF-8 do not parse (400); a surrogate encoded as bytes (CESU-8's ED A0 80) does, since
    # Python's json decodes bytes with "surrogatepass", and meets the text check as the escape "\ud800" does (422).
    for raw, status, code in ((b"\xff", 400, "bad_json"), (b"\xed\xa0\x80", 422, "bad_title")):
        r = client.post("/api/blogs/news/entries", data=b'{"title": "t' + raw + b'", "body": "b"}',
                        content_type="application/json")
        assert r.status_code == status and r.get_json()["error"]["code"] == code, raw
    assert _post(client, headers={"Idempotency-Key": "has space"}).status_code == 400
    assert client.post("/api/blogs/news/entries", data="x" * (ENTRY_BODY_BYTES + 1), content_type="application/json"
                       ).status_code == 413
    assert _stored(BlogIndex) == [] and _stored(BlogEntry) == [] and _stored(PostMarker) == []


def test_the_largest_valid_entry_fits_the_body_limit(client, auth):
    """The longest title and body, every character outside ASCII: as JSON escapes them by default ("\\u00e9", 6 bytes,
    and a surrogate pair of 12 for one outside the BMP) the body is far larger than its characters, and still valid."""
    auth.admin()
    for char in ("\u00e9", "\U0001f600"):
        r = _post(client, title=char * 200, body=char * 100_000)  # the test client's json= escapes as json.dumps does
        assert r.status_code == 201, (char, r.status_code)
        assert r.get_json()["body"] == char * 100_000
    form = {"csrf_token": csrf_token(client, "/blog"), "blog": "diary", "title": "\U0001f600" * 200,
            "body": "\U0001f600" * 100_000}  # a form percent-encodes each as 12 bytes, past Flask's 500 KB for a field
    assert client.post("/blog", data=form).status_code == 302


def test_idempotency_key_over_the_api(client, auth):
    auth.admin()
    first = _post(client, headers={"Idempotency-Key": "k1"})
    again = _post(client, headers={"Idempotency-Key": "k1"})
    assert (first.status_code, again.status_code) == (201, 201) and again.get_json() == first.get_json()
    assert (first.headers.get("Idempotent-Replayed"), again.headers.get("Idempotent-Replayed")) == (None, "true")
    assert _post(client, headers={"Idempotency-Key": "k2"}).get_json()["index"] == 1


def test_front_page_html_is_cached_and_never_stale(client, auth):
    auth.admin()
    for i in range(12):
        _post(client, title=f"entry {i}")
    html = client.get("/blog/news").get_data(as_text=True)
    assert "read from Datastore" in html and "entry 11" in html and "entry 1<" not in html
    html = client.get("/blog/news").get_data(as_text=True)
    assert "front page from memcache" in html
    assert _post(client, title="brand new").status_code == 201
    html = client.get("/blog/news").get_data(as_text=True)
    assert "brand new" in html
    assert client.get("/api/blogs/news/entries").get_json()["entries"][0]["title"] == "brand new"


def test_the_feed_is_cached_and_never_stale(client, auth):
    auth.admin()
    _post(client, title="first")
    feeds = [client.get("/blog/news/feed.atom") for _ in range(3)]
    assert feeds[2].get_data() == feeds[1].get_data() and billed(feeds[2])[:3] == (0, 0, 0)  # from the cache
    assert feeds[2].mimetype == "application/atom+xml"
    # A slow reader: it read the feed's page before the post below, and stores it only after that post committed,
    # under the key it computed then (the race a delete-on-commit loses).
    with runtime.current().context():
        top = service.require_blog("news").max_index
        rows, after = service.query_page(ndb.Key(BlogIndex, "news"), top, service.FEED_SIZE)
        old_page = zlib.compress(json.dumps([[entry_dict(e) for e in rows], after]).encode())
        old_key = service._page_cache_key("news", top, service.FEED_SIZE)
    _post(client, title="second")
    runtime.current().cache.add(old_key, old_page, expire=60)
    root = ET.fromstring(client.get("/blog/news/feed.atom").get_data())
    titles = [e.text for e in root.iter("{http://www.w3.org/2005/Atom}title")]
    assert "second" in titles and "first" in titles


def test_pages_link_older_and_newer(client, auth):
    auth.admin()
    for i in range(25):
        _post(client, title=f"entry {i}")
    front = client.get("/blog/news").get_data(as_text=True)
    assert 'href="/blog/news?start=14"' in front and "Newer" not in front
    middle = client.get("/blog/news?start=14").get_data(as_text=True)
    assert 'href="/blog/news?start=4"' in middle and 'href="/blog/news"' in middle
    last = client.get("/blog/news?start=4").get_data(as_text=True)
    assert "Older" not in last and 'href="/blog/news?start=14"' in last and "entry 0" in last


def test_entry_page_counts_views(client, auth):
    auth.admin()
    _post(client)
    _post(client, title="Two")
    for expected in (1, 2, 3):
        # The page's script sends this POST once the page has loaded; the page's GET itself writes nothing.
        assert client.post("/api/blogs/news/entries/0/views").get_json() == {"views": expected}
        html = client.get("/blog/news/0").get_data(as_text=True)
        assert f"<span data-views>{expected} view{'s' if expected > 1 else ''}</span>" in html
    assert 'href="/blog/news/1"' in html and "Older entry" not in html
    assert client.get("/api/blogs/news/entries/0").get_json()["views"] == 3
    assert client.get("/api/counters").get_json()["counters"] == []  # views counters are not listed


def test_hostile_title_and_body_render_as_text(client, auth):
    auth.admin()
    _post(client, title='<script>alert("t")</script>', body='<script>alert("b")</script>[x](javascript:alert(1))')
    for path in ("/blog/news", "/blog/news/0", "/blog/news/feed.atom"):
        html = client.get(path).get_data(as_text=True)
        # No script and no javascript: URL in an attribute, escaped (the feed) or not. The link's text may stay as
        # text: CommonMark reads a line that starts with <script> as raw HTML to its end, and nh3 keeps what follows
        # the dropped element as inert text.
        assert "<script>alert" not in html and not re.search(r"(href|src)=\S*javascript:", html)
    assert "&lt;script&gt;alert(&#34;t&#34;)&lt;/script&gt;" in client.get("/blog/news").get_data(as_text=True)


def test_atom_feed(client, auth):
    auth.admin()
    for i in range(25):
        _post(client, title=f"entry {i}", body=f"**bold {i}**")
    r = client.get("/blog/news/feed.atom")
    assert r.status_code == 200 and r.mimetype == "application/atom+xml"
    ns = {"a": "http://www.w3.org/2005/Atom"}
    feed = ET.fromstring(r.data)
    entries = feed.findall("a:entry", ns)
    assert len(entries) == 20 and entries[0].find("a:title", ns).text == "entry 24"
    assert entries[0].find("a:id", ns).text == "http://localhost/blog/news/24"
    assert entries[0].find("a:content", ns).text == "<p><strong>bold 24</strong></p>"
    assert client.get("/blog/nope/feed.atom").status_code == 404


@pytest.mark.parametrize("body", ["[" * 6000, "[" * 12000, "[a](" * 3000, "![" * 6000])
def test_issue_57s_markdown_bodies_are_posted_and_render_as_text(client, auth, body):
    """The bodies that took Python-Markdown 11.6 s to 41 s: accepted, rendered as the text they are (how the time
    grows with the length is tests/test_blog.py's test_markdown_renders_in_time_that_grows_linearly_with_the_text)."""
    auth.admin()
    r = _post(client, body=body)
    assert r.status_code == 201
    assert r.get_json()["body_html"] == f"<p>{body}</p>"


def test_text_that_xml_and_utf8_carry_is_kept(client, auth):
    """Tab, line breaks (CR LF, as a browser sends a textarea's) and characters beyond the BMP (JSON's surrogate pair
    "\\ud83d\\ude00" is one character, not two lone surrogates) are text like any other."""
    auth.admin()
    r = client.post("/api/blogs/news/entries", data='{"title": "smile \\ud83d\\ude00", "body": "a\\tb\\r\\nc"}',
                    content_type="application/json")
    assert r.status_code == 201, r.get_data(as_text=True)
    assert (r.get_json()["title"], r.get_json()["body"]) == ("smile \U0001f600", "a\tb\r\nc")
    root = ET.fromstring(client.get("/blog/news/feed.atom").get_data())
    assert root.find(f"{ATOM}entry/{ATOM}title").text == "smile \U0001f600"


def test_the_admin_form_refuses_a_noncharacter_and_writes_nothing(client, auth):
    """A form's bytes that are not UTF-8 arrive as U+FFFD (werkzeug decodes with "replace"), but a noncharacter is
    valid UTF-8: the form meets the same check as the API."""
    auth.admin()
    r = client.post("/blog", data={"csrf_token": csrf_token(client, "/blog"), "blog": "diary",
                                   "title": "broken \uffff feed", "body": "b"})
    assert r.status_code == 422 and "title holds U+FFFF" in r.get_data(as_text=True)
    assert _stored(BlogIndex) == [] and _stored(BlogEntry) == []


def test_the_feed_is_well_formed_xml_whatever_was_stored_before(client, auth):
    """Entries written before titles and bodies were checked (written here straight through ndb, past the service's
    checks) may hold characters XML 1.0 has no place for; the feed leaves them out and stays well-formed (issue 57:
    one such title made the feed unreadable until 20 newer entries pushed it out)."""
    with runtime.current().context():
        BlogIndex(id="news", max_index=1).put()
        for index, title in enumerate(["broken \uffff feed", "bell \x07 and \ufdd0 and \U0001ffff"]):
            BlogEntry(key=EntryRef("news", index).key, index=index, title=title, body="b",
                      body_html="<p>x\x01y\ufffe</p>", author="boss\x1b").put()
    r = client.get("/blog/news/feed.atom")
    assert r.status_code == 200
    root = ET.fromstring(r.get_data())  # raises ParseError on a character XML forbids
    titles = [e.find(f"{ATOM}title").text for e in root.findall(f"{ATOM}entry")]
    assert titles == ["bell  and  and ", "broken  feed"]
    assert [e.find(f"{ATOM}content").text for e in root.findall(f"{ATOM}entry")] == ["<p>xy</p>"] * 2
    assert [e.find(f"{ATOM}author/{ATOM}name").text for e in root.findall(f"{ATOM}entry")] == ["boss"] * 2


ATOM = "{http://www.w3.org/2005/Atom}"
HOSTS = ("localhost", "127.0.0.1:8080", "localhost:5000", "127.0.0.1")


def test_feed_ids_are_the_same_under_every_host(client, auth):
    """Atom ids are permanent (RFC 4287 4.2.6): built on the app's canonical name, never on the request's Host."""
    auth.admin()
    _post(client, title="first")
    _post(client, title="second")
    ids = {}
    for host in HOSTS:
        root = ET.fromstring(client.get("/blog/news/feed.atom", headers={"Host": host}).get_data())
        ids[host] = [e.text for e in root.iter(f"{ATOM}id")]
        links = [e.get("href") for e in root.iter(f"{ATOM}link")]
        assert links == ["/blog/news", "/blog/news/feed.atom", "/blog/news/1", "/blog/news/0"], host
    assert ids["localhost"] == ["http://localhost/blog/news", "http://localhost/blog/news/1",
                                "http://localhost/blog/news/0"]
    assert all(found == ids["localhost"] for found in ids.values()), ids


@pytest.mark.parametrize("path", ["/blog/news", "/blog/news/feed.atom"])
def test_a_cached_page_is_cached_once_whatever_the_host(app, client, auth, path):
    """The front page and the feed are read from the cache under every Host name (on App Engine any
    `<anything>-dot-PROJECT.appspot.com` reaches the app): a new name costs no read of its own."""
    auth.admin()
    _post(client, title="first")
    visitor = app.test_client()
    for _ in range(2):
        first = visitor.get(path, headers={"Host": HOSTS[0]})
    assert billed(first)[:3] == (0, 0, 0)
    for host in HOSTS[1:]:
        r = visitor.get(path, headers={"Host": host})
        assert r.status_code == 200 and billed(r)[:3] == (0, 0, 0), (host, r.headers["Server-Timing"])


def test_admin_post_form(client, auth):
    auth.admin()
    token = csrf_token(client, "/blog")
    form = {"csrf_token": token, "blog": "diary", "title": "Day one", "body": "It *began*.", "post_token": "form-1"}
    r = client.post("/blog", data=form)
    assert r.status_code == 302 and r.headers["Location"].endswith("/blog/diary/0")
    assert client.post("/blog", data=form).headers["Location"].endswith("/blog/diary/0")  # double submit: one entry
    r = client.post("/blog/diary/entries", data=dict(form, title="Day two", post_token="form-2"))
    assert r.headers["Location"].endswith("/blog/diary/1")
    page = client.get("/blog/diary").get_data(as_text=True)
    assert "Day two" in page and "It <em>began</em>." in page
    assert len(_stored(BlogEntry)) == 2


def test_post_form_errors_keep_what_was_typed_and_write_nothing(client, auth):
    auth.admin()
    token = csrf_token(client, "/blog")
    r = client.post("/blog", data={"csrf_token": token, "blog": "diary", "title": "x" * 201, "body": "kept body"})
    assert r.status_code == 422
    html = r.get_data(as_text=True)
    assert "title must be 1 to 200 characters" in html and "kept body" in html
    r = client.post("/blog", data={"csrf_token": token, "blog": "Bad Name", "title": "t", "body": "b"})
    assert r.status_code == 400
    assert _stored(BlogIndex) == [] and _stored(BlogEntry) == []


def test_post_form_needs_csrf_and_an_admin(client, auth):
    auth.admin()
    r = client.post("/blog", data={"blog": "diary", "title": "t", "body": "b"})
    assert r.status_code == 400
    auth.sign_in("reader@example.com")
    token = csrf_token(client, "/blog")
    assert "Start a blog" not in client.get("/blog").get_data(as_text=True)
    r = client.post("/blog", data={"csrf_token": token, "blog": "diary", "title": "t", "body": "b"})
    assert r.status_code == 403
    assert _stored(BlogIndex) == []


def test_pages_work_when_memcached_is_down(client, auth, stack):
    auth.admin()
    for i in range(3):
        _post(client, title=f"entry {i}")
    stack.cache.stop()
    try:
        assert "entry 2" in client.get("/blog/news").get_data(as_text=True)
        # the entry's first view cannot create its views counter (a cached kind): the page and the count answer all
        # the same
        html = client.get("/blog/news/1").get_data(as_text=True)
        assert "entry 1" in html and "<span data-views>0 views</span>" in html
        assert client.post("/api/blogs/news/entries/1/views").get_json() == {"views": 0}
        r = _post(client, title="during outage")
        assert r.status_code == 503 and r.get_json()["error"]["code"] == "cache_unavailable"
    finally:
        stack.cache.start()
    assert client.get("/api/blogs/news/entries").get_json()["entries"][0]["title"] == "entry 2"


def test_blog_pages_when_datastore_is_down(weak_stack, weak_app):
    client = weak_app.test_client()
    client.post("/api/session", json={"email": "boss@example.com", "admin": True})
    assert _post(client).status_code == 201
    assert client.get("/blog/news").status_code == 200  # the front page is now cached, its BlogIndex too
    weak_stack.emulator.stop()
    r = client.get("/blog/news/0")
    assert r.status_code == 503 and "Traceback" not in r.get_data(as_text=True)
    r = _post(client, title="x")
    assert r.status_code == 503 and r.get_json()["error"]["code"] == "datastore_unavailable"


def test_only_an_admin_may_read_the_front_page_without_its_cache(client, auth):
    """`?cache=bypass` (make load's front-page scenario): read as if there were no cache, storing nothing in it."""
    auth.admin()
    for i in range(3):
        _post(client, title=f"entry {i}")
    runtime.current().cache.flush()
    bypassed = client.get("/api/blogs/news/entries?cache=bypass").get_json()
    assert [e["index"] for e in bypassed["entries"]] == [2, 1, 0] and bypassed["cached"] is False
    assert "read from Datastore" in client.get("/blog/news?cache=bypass").get_data(as_text=True)
    # nothing was stored: the next ordinary read is the first to fill the cache, the one after it is served from it
    assert client.get("/api/blogs/news/entries").get_json()["cached"] is False
    assert client.get("/api/blogs/news/entries").get_json()["cached"] is True
    assert client.get("/api/blogs/news/entries?cache=bypass").get_json()["cached"] is False
    r = client.get("/api/blogs/news/entries?cache=off")
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "bad_cache"
    auth.sign_in("reader@example.com")
    assert client.get("/api/blogs/news/entries?cache=bypass").status_code == 403
    assert client.get("/blog/news?cache=bypass").status_code == 403
    auth.sign_out()
    assert client.get("/api/blogs/news/entries?cache=bypass").status_code == 401
    assert client.get("/api/blogs/news/entries").get_json()["cached"] is True  # the default: the cache, for anyone


def test_an_idempotency_key_that_looks_reserved_is_a_key_like_any_other(client, auth):
    """A post's marker was keyed by its Idempotency-Key: `__k__` was a reserved key name, a 500 from Datastore, then a
    400 (issue 75). Its marker's name is a digest now (core/idempotency.marker_name): the key posts once like any."""
    auth.admin()
    first, again = (_post(client, headers={"Idempotency-Key": "__k__"}) for _ in range(2))
    assert (first.status_code, again.status_code) == (201, 201) and again.get_json() == first.get_json()
    assert len(_stored(BlogEntry)) == 1 and not any(key.id().startswith("__") for key in _stored(PostMarker))
