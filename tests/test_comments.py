"""Comments on the real stack: per-user sequences under concurrency, paging both ways, bookmarks, own comments."""
import datetime

import pytest
from google.cloud import ndb

from blog import demo as blog_demo
from blog import service as blog_service
from blog.models import EntryRef
from comments import service, views
from comments.models import Comment, UserSequence
from core import people, runtime, transactions
from core.errors import BadInput, Conflict, NotFound, SignInRequired, Unprocessable
from counters import growth, totals
from tests.support import commit_answers_unknown, in_threads, writers_meet_before_writing


def _user(name):
    return {"id": f"dev-{name}", "email": f"{name}@example.com"}


def _entry(blog="b", count=1):
    for i in range(count):
        blog_service.post_entry(blog, f"entry {i}", "body", "boss@example.com")


def _exact_count(blog, index):
    config = growth.get_config(service.COUNTERS.name(service.comments_counter(EntryRef(blog, index))))
    return sum(totals.shard_counts_of(config)) if config else 0


def _walk_forward(limit, **kw):
    pages, after = [], None
    while True:
        page = service.get_comments(EntryRef("b", 0), after=after, limit=limit, **kw)
        pages.append(page)
        if page.next is None:
            return pages
        after = page.next


def test_sixteen_users_by_ten_concurrently(app):
    with runtime.current().context():
        _entry()
    users = [_user(f"u{i}") for i in range(16)]

    def post_ten(i):
        return [service.post_comment(EntryRef("b", 0), users[i], f"comment {n} of {i}")["id"] for n in range(10)]
    ids = [c for batch in in_threads(16, post_ten) for c in batch]
    assert len(ids) == 160 and len(set(ids)) == 160
    with runtime.current().context():
        stored = Comment.query(Comment.entry == "b/0").fetch()
        assert sorted(c.sort_key for c in stored) == sorted(ids)
        for user in users:
            group = people.pseudonym(user)
            seqs = sorted(int(c.sort_key.rsplit("|", 1)[1]) for c in stored if c.key.parent().id() == group)
            assert seqs == list(range(1, 11)), user  # dense: no sequence number skipped or repeated
            assert ndb.Key(UserSequence, group).get().seq == 10
        assert _exact_count("b", 0) == 160
        assert service.comment_counts([EntryRef("b", 0)]) == {EntryRef("b", 0): 160}


def test_two_comments_of_one_user_that_both_read_the_sequence_before_either_writes_get_two_numbers(app, monkeypatch):
    """One user's sequence stays dense and unique by its transaction alone: with the turns at the user's sequence gone
    (as for two tabs that each went on without the lease), two comments both read seq 1 before either writes, every
    time (writers_meet_before_writing); one commits 2, the other collides, retries and gets 3."""
    user = _user("tabs")
    with runtime.current().context():
        _entry()
        service.post_comment(EntryRef("b", 0), user, "first")
    writers_meet_before_writing(monkeypatch)
    in_threads(2, lambda i: service.post_comment(EntryRef("b", 0), user, f"tab {i}"))
    with runtime.current().context():
        group = people.pseudonym(user)
        mine = Comment.query(ancestor=ndb.Key(UserSequence, group)).fetch()
        assert sorted(int(c.sort_key.rsplit("|", 1)[1]) for c in mine) == [1, 2, 3]
        assert sorted(c.text for c in mine) == ["first", "tab 0", "tab 1"]
        assert ndb.Key(UserSequence, group).get().seq == 3


def _insert(entry, when, user_id, seq, text="x"):
    """A comment written with a chosen time: how comments with identical timestamps are made reproducibly."""
    key_name = service.sort_key(when, user_id, seq)
    Comment(key=ndb.Key(UserSequence, user_id, Comment, key_name), entry=entry, sort_key=key_name, text=text,
            author=user_id, created=when).put()
    return key_name


@pytest.mark.parametrize("limit", [1, 3, 7, 20, 40])
def test_paging_forward_then_backward_gives_the_same_pages(ndb_context, limit):
    _entry()
    same_time = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901)
    ids = [_insert("b/0", same_time, f"user{u}", s) for u in range(4) for s in range(1, 4)]  # 12 at one instant
    ids += [_insert("b/0", same_time + datetime.timedelta(microseconds=1), "user0", 4)]
    ids += [service.post_comment(EntryRef("b", 0), _user(f"p{i % 3}"), f"posted {i}")["id"] for i in range(12)]
    expected = sorted(ids)
    pages = _walk_forward(limit)
    walked = [c["id"] for p in pages for c in p.items]
    assert walked == expected  # oldest first, every comment exactly once
    assert all(len(p.items) == limit for p in pages[:-1]) and 1 <= len(pages[-1].items) <= limit
    assert pages[0].prev is None and pages[-1].next is None
    for earlier, later in zip(pages, pages[1:], strict=False):
        assert later.prev is not None
        back = service.get_comments(EntryRef("b", 0), before=later.prev, limit=limit)
        assert back.items == earlier.items and back.next == earlier.next and back.prev == earlier.prev
    last = service.get_comments(EntryRef("b", 0), limit=limit, last=True)
    assert [c["id"] for c in last.items] == expected[-limit:] and last.next is None
    assert last.prev == (expected[-limit] if len(expected) > limit else None)


def test_several_peoples_comments_come_in_the_order_they_were_written(ndb_context):
    """Comments of several people, interleaved, are listed in the order they were written (the sort key's time comes
    first, not its author), on one page and walked a page at a time both ways."""
    _entry()
    ref, order = EntryRef("b", 0), ["ann", "bob", "cy", "bob", "ann", "cy", "cy", "ann", "bob"]
    written = [service.post_comment(ref, _user(who), f"{n}: {who}")["text"] for n, who in enumerate(order)]
    assert [c["text"] for c in service.get_comments(ref).items] == written
    assert [c["text"] for p in _walk_forward(2) for c in p.items] == written
    back, page = [], service.get_comments(ref, limit=2, last=True)
    while True:
        back = [c["text"] for c in page.items] + back
        if page.prev is None:
            break
        page = service.get_comments(ref, limit=2, before=page.prev)
    assert back == written


def test_own_comments_are_merged_only_into_the_page_they_belong_on(ndb_context):
    _entry()
    ids = [service.post_comment(EntryRef("b", 0), _user(f"u{i % 4}"), f"c{i}")["id"] for i in range(17)]
    plain = [[c["id"] for c in p.items] for p in _walk_forward(5)]
    with_own = [[c["id"] for c in p.items] for p in _walk_forward(5, own=ids + ["garbage", "1|2|3"])]
    assert with_own == plain  # the query already has them all: merging adds nothing and moves nothing


def test_own_comment_the_query_has_not_seen_yet_is_on_the_page(ndb_context, monkeypatch):
    """A page's query spans many users' groups and may lag behind a comment just written (eventually consistent on
    legacy); here it lags every time: the query misses the newest comment. Its writer, whose own ids the page is
    given, sees it at once in its place; another reader does not see it yet."""
    _entry()
    ref = EntryRef("b", 0)
    others = [service.post_comment(ref, _user("other"), f"other {i}")["id"] for i in range(3)]
    mine = service.post_comment(ref, _user("me"), "mine")["id"]
    real_fetch = ndb.Query.fetch
    monkeypatch.setattr(ndb.Query, "fetch",
                        lambda query, *args, **kw: [c for c in real_fetch(query, *args, **kw) if c.key.id() != mine])
    assert [c["id"] for c in service.get_comments(ref).items] == others  # the lagging query
    assert [c["id"] for c in service.get_comments(ref, own=[mine]).items] == [*others, mine]
    assert [c["id"] for c in service.get_comments(ref, last=True, own=[mine]).items] == [*others, mine]


def test_own_comment_is_seen_at_once_at_consistency_0_9(weak_app):
    with runtime.current().context():
        _entry()
        user, own = _user("me"), []
        for i in range(15):
            comment = service.post_comment(EntryRef("b", 0), user, f"mine {i}")
            own = (own + [comment["id"]])[-views.RECENT_KEEP:]
            page = service.get_comments(EntryRef("b", 0), last=True, own=own)
            assert page.items[-1]["id"] == comment["id"]


@pytest.mark.parametrize("bookmark", ["garbage", "", "20260101T000000.000000Z|u|1",
                                      "20260101T000000.000000Z|u|0000000001",  # well formed, no such comment
                                      "20260101T000000.000000Z|u|0000000001x", "2026|u|0000000001",
                                      "20260101T000000.000000Z|a|b|0000000001"])
def test_forged_bookmarks_are_400(ndb_context, bookmark):
    _entry()
    service.post_comment(EntryRef("b", 0), _user("u"), "hello")
    for kw in ({"after": bookmark}, {"before": bookmark}):
        with pytest.raises(BadInput):
            service.get_comments(EntryRef("b", 0), **kw)


def test_truncated_and_foreign_bookmarks_are_400(ndb_context):
    _entry(count=2)
    mine = service.post_comment(EntryRef("b", 0), _user("u"), "on entry 0")["id"]
    foreign = service.post_comment(EntryRef("b", 1), _user("u"), "on entry 1")["id"]
    assert service.get_comments(EntryRef("b", 0), after=mine).items == []
    for bad in (mine[:-1], mine[:20], foreign):
        with pytest.raises(BadInput):
            service.get_comments(EntryRef("b", 0), after=bad)
    with pytest.raises(BadInput):
        service.get_comments(EntryRef("b", 0), after=mine, before=mine)


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "x" * 2001, "nul\x00", 5, None, ["list"]])
def test_bad_text_writes_nothing(ndb_context, text):
    _entry()
    with pytest.raises(Unprocessable):
        service.post_comment(EntryRef("b", 0), _user("u"), text)
    assert Comment.query().fetch(keys_only=True) == [] and UserSequence.query().fetch(keys_only=True) == []
    assert growth.get_config(service.comments_counter(EntryRef("b", 0))) is None


def test_anonymous_and_unknown_entries(ndb_context):
    _entry()
    with pytest.raises(SignInRequired):
        service.post_comment(EntryRef("b", 0), None, "hi")
    with pytest.raises(NotFound):
        service.post_comment(EntryRef("b", 5), _user("u"), "hi")
    with pytest.raises(NotFound):
        service.get_comments(EntryRef("nope", 0))
    assert Comment.query().fetch(keys_only=True) == []


def test_a_resent_comment_is_written_and_counted_once(ndb_context):
    _entry()
    first = service.post_comment(EntryRef("b", 0), _user("u"), "once", "form-token-1")
    again = service.post_comment(EntryRef("b", 0), _user("u"), "once", "form-token-1")
    assert again == first
    assert len(Comment.query().fetch()) == 1 and _exact_count("b", 0) == 1
    service.post_comment(EntryRef("b", 0), _user("u"), "twice", "form-token-2")
    assert _exact_count("b", 0) == 2


def test_a_resend_after_many_comments_answers_with_its_comment(ndb_context):
    """A key's marker is kept for its lifetime, however many comments come after: a resend of any of them, the oldest
    too, answers with the comment its first send wrote, and writes and counts nothing (issue 72: it was the last 8)."""
    _entry()
    ref, user, n = EntryRef("b", 0), _user("u"), 11
    sent = [service.post_comment(ref, user, f"c{i}", f"form-token-{i}") for i in range(n)]
    for i in range(n):
        assert service.post_comment(ref, user, f"c{i}", f"form-token-{i}") == sent[i]
    assert len(Comment.query().fetch()) == n and _exact_count("b", 0) == n


def test_a_resent_comment_that_was_removed_since_is_a_conflict_not_posted_again(ndb_context):
    """The request's first send wrote the comment, and it was deleted since (by hand: no page deletes one): the resend
    finds its request's marker but no comment, and says so instead of failing on None."""
    _entry()
    first = service.post_comment(EntryRef("b", 0), _user("u"), "once", "form-token-1")
    Comment.query().get(keys_only=True).delete()
    with pytest.raises(Conflict, match="removed"):
        service.post_comment(EntryRef("b", 0), _user("u"), "once", "form-token-1")
    assert Comment.query().fetch() == [] and _exact_count("b", 0) == 1
    assert ndb.Key(UserSequence, people.pseudonym(_user("u"))).get().seq == 1
    assert first["id"] not in [c["id"] for c in service.get_comments(EntryRef("b", 0)).items]


@pytest.mark.parametrize("idempotency_key", [None, "form-token-1"])
def test_a_comment_whose_commit_answered_unknown_but_applied_is_written_and_counted_once(ndb_context, monkeypatch,
                                                                                         idempotency_key):
    """A commit can fail as UNKNOWN and yet have applied; `transact` then runs the transaction again, which finds the
    comment this very call wrote: it answers with it, writes nothing more, and the comment is still counted (the count
    follows the commit). A resend of the request (a new call, the same key) is neither written nor counted again."""
    _entry()
    answered = commit_answers_unknown(monkeypatch, "commented.<locals>.post")
    comment = service.post_comment(EntryRef("b", 0), _user("u"), "once", idempotency_key)
    monkeypatch.undo()
    assert answered  # the commit did answer UNKNOWN
    assert [c.sort_key for c in Comment.query().fetch()] == [comment["id"]]
    assert _exact_count("b", 0) == 1
    if idempotency_key:
        assert service.post_comment(EntryRef("b", 0), _user("u"), "once", idempotency_key) == comment
        assert len(Comment.query().fetch()) == 1 and _exact_count("b", 0) == 1


def test_a_retry_after_an_unknown_commit_finds_its_comment_though_another_tab_posted_meanwhile(ndb_context,
                                                                                               monkeypatch):
    """The user's other tab may post while this comment's transaction backs off after a commit that answered UNKNOWN
    yet applied: the retry still finds its own call's marker, and neither comment is written or counted twice."""
    _entry()
    user, real_backoff = _user("tabs"), transactions.backoff
    answered = commit_answers_unknown(monkeypatch, "commented.<locals>.post")

    def other_tab_posts_meanwhile(attempt, base, cap):  # while this tab backs off, out of its turn at the sequence
        if len(answered) == 1:
            answered.append("the other tab")
            service.post_comment(EntryRef("b", 0), user, "from the other tab")
        real_backoff(attempt, base, cap)

    monkeypatch.setattr(transactions, "backoff", other_tab_posts_meanwhile)
    comment = service.post_comment(EntryRef("b", 0), user, "from this tab")
    monkeypatch.undo()
    assert len(answered) == 2
    assert comment["text"] == "from this tab"
    assert sorted(c.text for c in Comment.query().fetch()) == ["from the other tab", "from this tab"]
    assert _exact_count("b", 0) == 2


def test_comments_survive_memcached_down(ndb_context, stack):
    _entry()
    service.post_comment(EntryRef("b", 0), _user("u"), "first")  # creates the count's counter while memcached is up
    stack.cache.stop()
    try:
        service.post_comment(EntryRef("b", 0), _user("u"), "while memcached is away")
        assert [c["text"] for c in service.get_comments(EntryRef("b", 0)).items] == ["first", "while memcached is away"]
    finally:
        stack.cache.start()
    assert _exact_count("b", 0) == 2


def test_sort_key_is_fixed_width_and_rejects_the_separator():
    when = datetime.datetime(2026, 11, 21, 1, 2, 3, 4)
    assert service.sort_key(when, "u", 7) == "20261121T010203.000004Z|u|0000000007"
    assert service.sort_key(datetime.datetime(999, 1, 1), "u", 1) < service.sort_key(when, "u", 1)
    with pytest.raises(ValueError):
        service.sort_key(when, "a|b", 1)


def test_demo_seed_gives_pages_of_comments(app):
    output = app.test_cli_runner().invoke(args=["seed"]).output
    assert "blog: seeded" in output and "comments: seeded" in output
    with runtime.current().context():
        top = blog_service.get_blog(blog_demo.DEMO_BLOG).max_index
        assert top == blog_demo.DEMO_ENTRIES - 1
        first = service.get_comments(EntryRef("demo", top))
        assert len(first.items) == service.PAGE_SIZE and first.next is not None
        assert len({c["author"] for c in first.items}) >= 3
        assert service.comment_counts([EntryRef("demo", top), EntryRef("demo", top - 1)]) == {
            EntryRef("demo", top): 45, EntryRef("demo", top - 1): 12}


def test_an_authors_new_comment_is_merged_into_its_own_entrys_page_only(client, auth):
    """The ids of a person's latest comments ride in their session and are merged into every entry page they open
    (read-your-writes, comments/bookmarks.with_own): a comment just posted under one entry shows on that entry's page,
    in the HTML and the JSON, and on no other entry's, though that page is given the same ids."""
    auth.admin()
    for i in range(2):
        assert client.post("/api/blogs/news/entries", json={"title": f"Entry {i}", "body": "text"}).status_code == 201
    auth.sign_in("ann@example.com")
    posted = client.post("/api/blogs/news/entries/0/comments", json={"text": "said under entry zero"})
    assert posted.status_code == 201, posted.get_data(as_text=True)
    mine = posted.get_json()["id"]
    assert client.post("/api/blogs/news/entries/1/comments", json={"text": "said under entry one"}).status_code == 201
    for page in ("", "?page=last"):
        listed = client.get(f"/api/blogs/news/entries/0/comments{page}").get_json()["comments"]
        assert [c["text"] for c in listed] == ["said under entry zero"]
        other = client.get(f"/api/blogs/news/entries/1/comments{page}").get_json()["comments"]
        assert [c["text"] for c in other] == ["said under entry one"] and mine not in [c["id"] for c in other]
        assert "said under entry zero" in client.get(f"/blog/news/0{page}").get_data(as_text=True)
        html = client.get(f"/blog/news/1{page}").get_data(as_text=True)
        assert "said under entry one" in html and "said under entry zero" not in html
