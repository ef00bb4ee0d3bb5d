"""Comments over HTTP: the JSON API, the form under an entry, the pages."""
import re

import pytest

from comments.models import Comment, UserSequence
from core import identity, runtime
from tests.support import Auth, csrf_token


def _stored(kind):
    with runtime.current().context():
        return kind.query().fetch(keys_only=True)


@pytest.fixture
def entry(client, auth):
    auth.admin()
    for i in range(2):
        assert client.post("/api/blogs/news/entries", json={"title": f"Entry {i}", "body": "text"}).status_code == 201
    auth.sign_out()


def _comment(client, text, index=0, **kw):
    return client.post(f"/api/blogs/news/entries/{index}/comments", json={"text": text}, **kw)


def test_post_and_page_over_the_api(client, auth, entry):
    auth.sign_in("ann@example.com")
    r = _comment(client, "first!")
    assert r.status_code == 201, r.get_data(as_text=True)
    c = r.get_json()
    assert c["text"] == "first!" and c["author"] == "ann"
    assert re.fullmatch(r"\d{8}T\d{6}\.\d{6}Z\|[^|]+\|0000000001", c["id"])
    for i in range(4):
        _comment(client, f"more {i}")
    first = client.get("/api/blogs/news/entries/0/comments?limit=2").get_json()
    assert [x["text"] for x in first["comments"]] == ["first!", "more 0"] and first["prev"] is None
    listing = "/api/blogs/news/entries/0/comments"
    second = client.get(listing, query_string={"limit": 2, "after": first["next"]}).get_json()
    assert [x["text"] for x in second["comments"]] == ["more 1", "more 2"]
    back = client.get(listing, query_string={"limit": 2, "before": second["prev"]}).get_json()
    assert back == first
    assert client.get("/api/blogs/news/entries/0").get_json()["comment_count"] == 5
    assert client.get("/api/blogs/news/entries/1").get_json()["comment_count"] == 0


def test_several_peoples_comments_come_back_in_writing_order_page_by_page_both_ways(app, entry):
    """Three people comment in turns, each comment answered before the next is sent, so writing order is time order.
    The listing gives them back in that order whoever wrote them: forwards page by page (`after=next`), and backwards
    from the last page (`before=prev`)."""
    writers = {}
    for name in ("ann", "bob", "cy"):
        writers[name] = app.test_client()
        Auth(writers[name]).sign_in(f"{name}@example.com")
    turns = ["ann", "bob", "cy", "bob", "ann", "cy", "cy", "ann", "bob", "ann", "cy", "bob", "bob"]
    written = []
    for n, name in enumerate(turns):
        r = _comment(writers[name], f"{n} by {name}")
        assert r.status_code == 201, r.get_data(as_text=True)
        written.append((r.get_json()["id"], f"{n} by {name}"))

    reader, listing = app.test_client(), "/api/blogs/news/entries/0/comments"
    forwards = [reader.get(listing, query_string={"limit": 4}).get_json()]
    while forwards[-1]["next"] is not None:
        forwards.append(reader.get(listing, query_string={"limit": 4, "after": forwards[-1]["next"]}).get_json())
    assert [(c["id"], c["text"]) for page in forwards for c in page["comments"]] == written
    assert [len(page["comments"]) for page in forwards] == [4, 4, 4, 1]
    backwards = [forwards[-1]]
    while backwards[-1]["prev"] is not None:
        backwards.append(reader.get(listing, query_string={"limit": 4, "before": backwards[-1]["prev"]}).get_json())
    assert [(c["id"], c["text"]) for page in reversed(backwards) for c in page["comments"]] == written
    assert backwards[1:] == forwards[-2::-1]  # the same pages, met the other way


def test_public_ids_and_authors_say_nothing_guessable_about_who(client, auth, entry):
    """A comment's id names its author's group; it must not be a hash anyone can compute from an email (the dev
    user id) or the user's IAP `sub`, and no page or answer carries the email itself."""
    user = auth.sign_in("ann@example.com")
    cid = _comment(client, "hello").get_json()["id"]
    author_part = cid.split("|")[1]
    assert user["id"] not in cid and identity.dev_user_id("ann@example.com") not in cid
    assert re.fullmatch(r"u[0-9a-f]{24}", author_part)
    assert _comment(client, "again").get_json()["id"].split("|")[1] == author_part  # one group per person
    auth.sign_in("bob@example.com")
    assert _comment(client, "mine").get_json()["id"].split("|")[1] != author_part
    auth.sign_out()
    listing = client.get("/api/blogs/news/entries/0/comments").get_data(as_text=True)
    page = client.get("/blog/news/0").get_data(as_text=True)
    entries = client.get("/api/blogs/news/entries").get_data(as_text=True)
    for text in (listing, page, entries, client.get("/blog/news").get_data(as_text=True)):
        assert "@example.com" not in text


def test_a_resend_with_its_idempotency_key_answers_the_first_comment_or_409_once_it_was_deleted(client, auth, entry):
    auth.sign_in("ann@example.com")
    first = _comment(client, "once", headers={"Idempotency-Key": "k-1"})
    again = _comment(client, "once", headers={"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 201 and again.get_json() == first.get_json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    [key] = _stored(Comment)
    with runtime.current().context():
        key.delete()  # by hand: no page deletes a comment
    removed = _comment(client, "once", headers={"Idempotency-Key": "k-1"})
    assert removed.status_code == 409 and removed.get_json()["error"]["code"] == "comment_removed"
    assert _stored(Comment) == [] and client.get("/api/blogs/news/entries/0").get_json()["comment_count"] == 1


def test_anonymous_comment_is_401_and_writes_nothing(client, entry):
    r = _comment(client, "hi")
    assert r.status_code == 401 and r.get_json()["error"]["code"] == "sign_in_required"
    assert _stored(Comment) == [] and _stored(UserSequence) == []


@pytest.mark.parametrize("body,status,code", [({"text": ""}, 422, "bad_text"), ({"text": "x" * 2001}, 422, "bad_text"),
                                              ({"text": 7}, 422, "bad_text"), ({}, 422, "bad_text"),
                                              # issue 57: a lone surrogate was a 500 at the write
                                              ({"text": "hi \ud800 there"}, 422, "bad_text"),
                                              ({"text": "hi \uffff there"}, 422, "bad_text"),
                                              ({"text": "hi \x00 there"}, 422, "bad_text"),
                                              ({"text": "ok", "extra": ["\udc00"]}, 422, "bad_extra")])
def test_bad_comment_bodies_write_nothing(client, auth, entry, body, status, code):
    auth.sign_in("ann@example.com")
    r = client.post("/api/blogs/news/entries/0/comments", json=body)
    assert r.status_code == status and r.get_json()["error"]["code"] == code
    assert _stored(Comment) == [] and _stored(UserSequence) == []
    assert client.get("/api/blogs/news/entries/0").get_json()["comment_count"] == 0


def test_bad_requests(client, auth, entry):
    auth.sign_in("ann@example.com")
    assert _comment(client, "hi", index=9).status_code == 404
    assert client.get("/api/blogs/news/entries/9/comments").status_code == 404
    cid = _comment(client, "hi").get_json()["id"]
    for query in ({"after": "forged"}, {"page": "last", "after": "forged"}, {"before": cid[:-3]},
                  {"after": cid, "before": cid}, {"limit": 0},
                  {"limit": 101}, {"limit": "ten"}):
        r = client.get("/api/blogs/news/entries/0/comments", query_string=query)
        assert r.status_code == 400, query
    foreign = _comment(client, "elsewhere", index=1).get_json()["id"]
    r = client.get("/api/blogs/news/entries/0/comments", query_string={"after": foreign})
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "bad_after"
    assert client.get("/blog/news/0", query_string={"after": "forged"}).status_code == 400
    assert client.get("/api/blogs/news/entries/0").get_json()["views"] == 0  # the refused page counted no view


def test_comment_form_and_entry_page(client, auth, entry):
    auth.sign_in("ann@example.com")
    token = csrf_token(client, "/blog/news/0")
    for i in range(23):
        r = client.post("/blog/news/0/comments", data={"csrf_token": token, "text": f"comment number {i}",
                                                       "comment_token": f"t{i}"})
        assert r.status_code == 302 and r.headers["Location"].endswith("/blog/news/0?page=last#comments-end")
    # sent twice (a double click): one comment
    client.post("/blog/news/0/comments",
                data={"csrf_token": token, "text": "comment number 22", "comment_token": "t22"})
    last = client.get("/blog/news/0?page=last").get_data(as_text=True)
    assert "comment number 22" in last and "comment number 2<" not in last and "Older comments" in last
    first = client.get("/blog/news/0").get_data(as_text=True)
    assert "comment number 0" in first and "comment number 19" in first and "comment number 20" not in first
    assert "Newer comments" in first and "<span data-comment-count>23</span>" in first
    older = re.search(r'href="([^"]+before=[^"#]+)', last).group(1).replace("&amp;", "&")
    assert "comment number 0" in client.get(older).get_data(as_text=True)
    assert "23 comments" in client.get("/blog/news").get_data(as_text=True)


def test_comment_form_error_keeps_the_text(client, auth, entry):
    auth.sign_in("ann@example.com")
    token = csrf_token(client, "/blog/news/0")
    r = client.post("/blog/news/0/comments", data={"csrf_token": token, "text": "y" * 2001})
    assert r.status_code == 422 and "y" * 2001 in r.get_data(as_text=True)
    assert _stored(Comment) == []
    r = client.post("/blog/news/0/comments", data={"csrf_token": token, "text": "kept \ufdd0 text"})
    assert r.status_code == 422 and "text holds U+FDD0" in r.get_data(as_text=True)
    r = client.post("/blog/news/0/comments", data={"text": "no token"})
    assert r.status_code == 400 and _stored(Comment) == []


def test_signed_out_readers_see_a_sign_in_link(client, entry):
    html = client.get("/blog/news/0").get_data(as_text=True)
    assert "to comment" in html and 'name="text"' not in html
    assert client.post("/blog/news/0/comments", data={"text": "x"}).status_code == 400  # no CSRF token


def test_hostile_comment_renders_as_text_with_safe_links(client, auth, entry):
    auth.sign_in("eve@example.com")
    _comment(client, '<script>alert(1)</script> javascript:alert(2) https://example.com/a?b=1&c=2 "><img src=x>')
    html = client.get("/blog/news/0").get_data(as_text=True)
    assert "<script>alert(1)" not in html and "<img src=x>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and 'href="javascript' not in html
    assert '<a href="https://example.com/a?b=1&amp;c=2" rel="nofollow noopener noreferrer">' in html


def test_the_front_page_shows_each_new_comment_count_though_its_entries_are_rendered_once(client, auth, entry):
    """blog/pages.py keeps each page of entries rendered in memory, keyed by what it shows: a new comment is a new
    count, so a new key, never the old HTML."""
    def counts_shown():
        html = client.get("/blog/news").get_data(as_text=True)
        return re.findall(r'#comments">(\d+) comments?</a>', html)
    fragments = client.application.extensions["blog.fragments"]
    assert counts_shown() == ["0", "0"] and counts_shown() == ["0", "0"]
    assert len(fragments) == 1  # the second view was served the first one's HTML
    auth.sign_in("ann@example.com")
    assert _comment(client, "one", index=1).status_code == 201
    assert counts_shown() == ["1", "0"]
    assert _comment(client, "two", index=1).status_code == 201 and _comment(client, "three").status_code == 201
    assert counts_shown() == ["2", "1"]
    assert len(fragments) == 3


def test_the_longest_comment_fits_its_routes_body_limit(client, auth, entry):
    """A comment route takes the most a valid comment needs, not BODY_BYTES (web.body_limit): 2,000 characters outside
    the BMP are 24,000 bytes as JSON's surrogate pairs and as a form's percent-encoding."""
    auth.sign_in("ann@example.com")
    longest = "\U0001f600" * 2000
    r = _comment(client, longest)
    assert r.status_code == 201 and r.get_json()["text"] == longest
    token = csrf_token(client, "/blog/news/0")
    assert client.post("/blog/news/0/comments", data={"csrf_token": token, "text": longest}).status_code == 302
    assert len(_stored(Comment)) == 2
