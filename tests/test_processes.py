"""The deployed shape: the app served as several processes on one emulator and one cache, as App Engine serves it
(instances, each gunicorn with workers of its own). Two gunicorn servers of two workers each stand in for two
instances; clients are spread over them and speak HTTP. Nothing in one worker's memory reaches another, so whatever
keeps the writers of one entity apart must work across processes: each test checks its invariant from the stored
data, and bounds the time generously (the speed is bench/posts.py's subject).
"""
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import requests
from google.cloud import ndb

from blog import service as blog_service
from blog.models import BlogEntry, BlogIndex, PostMarker
from comments.models import Comment, UserSequence
from core import hotspots, idempotency, people, runtime
from counters import totals as counters
from counters.models import CounterConfig
from devstack.services import REPO
from devstack.serving import app_env, instances, signed_in
from tests.support import WRITE_BUDGET, at_once, make_app, running

ADMIN = "boss@example.com"
SECRET = "processes-test-secret"


@pytest.fixture(scope="module")
def fleet(stack):
    """(the servers' URLs, an app in this process on the same namespace for reading the stored data back, the
    servers' environment)."""
    namespace = f"p{uuid.uuid4().hex[:12]}"  # the servers outlive any one test: a namespace of their own
    env = dict(app_env(stack, SECRET, admins=ADMIN), DATASTORE_NAMESPACE=namespace, WRITE_BUDGET=WRITE_BUDGET)
    with instances(env, count=2, workers=2) as servers:
        urls = [s.url for s in servers]
        app = make_app(stack, checked=False, DATASTORE_NAMESPACE=namespace, SECRET_KEY=SECRET)
        with running(app):
            yield urls, app, env


def _read(app, fn):
    return runtime.of(app).in_context(fn)()


def _at_once(count, fn):
    """fn(i) for i in range(count), all released at the same moment; their results and the slowest call's seconds."""
    done = at_once(count, fn)
    return [r for r, _ in done], max(t for _, t in done)


def test_posts_from_several_processes_are_dense_and_each_posted_once(fleet):
    urls, app, _ = fleet
    blog, posts = f"many-{uuid.uuid4().hex[:8]}", 16
    clients = [signed_in(urls[i % 2], ADMIN, admin=True) for i in range(posts)]

    def post(i):
        # Every post is sent twice with its key, the second time to the other instance: a client's retry.
        headers = {"Idempotency-Key": f"post-{i}"}
        answers = [clients[i].post(f"{urls[(i + n) % 2]}/api/blogs/{blog}/entries", headers=headers,
                                   json={"title": f"post {i}", "body": "body"}, timeout=120) for n in range(2)]
        return [(a.status_code, a.json().get("index")) for a in answers]
    answers, slowest = _at_once(posts, post)

    assert all(first == (201, again[1]) and again[0] == 201 for first, again in answers), answers
    entries = _read(app, lambda: BlogEntry.query(ancestor=ndb.Key(BlogIndex, blog)).fetch())
    assert sorted(e.index for e in entries) == list(range(posts))  # dense: no gap, no index twice
    assert sorted(e.title for e in entries) == sorted(f"post {i}" for i in range(posts))  # each post once
    assert _read(app, lambda: ndb.Key(BlogIndex, blog).get().max_index) == posts - 1
    admin_id = clients[0].get(f"{urls[0]}/api/session", timeout=30).json()["user"]["id"]
    names = [idempotency.marker_name(admin_id, blog_service.ENDPOINT, f"post-{i}") for i in range(posts)]
    markers = _read(app, lambda: ndb.get_multi([ndb.Key(PostMarker, name) for name in names]))
    assert [m.answer["index"] for m in markers] == [a[0][1] for a in answers]  # each key's marker, its entry
    # Without turns across processes the Firestore emulator held such a burst for 30 s and more (lock timeouts).
    assert slowest < 20, f"the slowest post took {slowest:.1f} s"


def test_one_users_comments_from_several_processes_get_a_dense_sequence(fleet):
    urls, app, _ = fleet
    admin = signed_in(urls[0], ADMIN, admin=True)
    blog = f"talk-{uuid.uuid4().hex[:8]}"
    assert admin.post(f"{urls[0]}/api/blogs/{blog}/entries", json={"title": "t", "body": "b"}).status_code == 201
    email, tabs, each = f"reader-{uuid.uuid4().hex[:6]}@example.com", 6, 3
    sessions = [signed_in(urls[i % 2], email) for i in range(tabs)]

    def tab(i):
        return [sessions[i].post(f"{urls[i % 2]}/api/blogs/{blog}/entries/0/comments", json={"text": f"{i}.{n}"},
                                 timeout=120).status_code for n in range(each)]
    statuses, slowest = _at_once(tabs, tab)

    assert all(s == 201 for tab_statuses in statuses for s in tab_statuses), statuses
    user = sessions[0].get(f"{urls[0]}/api/session").json()["user"]
    group = _read(app, lambda: people.pseudonym(user))  # the group a user's comments live in (comments/models.py)
    mine = _read(app, lambda: Comment.query(ancestor=ndb.Key(UserSequence, group)).fetch())
    assert sorted(int(c.sort_key.rsplit("|", 1)[1]) for c in mine) == list(range(1, tabs * each + 1))
    assert sorted(c.text for c in mine) == sorted(f"{i}.{n}" for i in range(tabs) for n in range(each))
    assert _read(app, lambda: ndb.Key(UserSequence, group).get().seq) == tabs * each
    assert slowest < 20, f"the slowest tab took {slowest:.1f} s"


def test_a_counter_created_at_once_in_several_processes_has_one_mode_and_counts_exactly(fleet):
    urls, app, _ = fleet
    name = f"race-{uuid.uuid4().hex[:8]}"
    clients = [signed_in(urls[i % 2], ADMIN, admin=True) for i in range(12)]
    modes = ["adaptive" if i % 2 else "general" for i in range(12)]

    def create(i):
        r = clients[i].put(f"{urls[(i // 2) % 2]}/api/counters/{name}", json={"mode": modes[i]}, timeout=120)
        return r.status_code, modes[i]
    answers, _ = _at_once(12, create)

    config = _read(app, lambda: ndb.Key(CounterConfig, name).get())
    # Whichever mode won, every answer agrees with what was stored: the winners' 200s, the others' 409s.
    assert sorted({mode for status, mode in answers if status == 200}) == [config.mode], answers
    assert all(status == 409 for status, mode in answers if mode != config.mode), answers

    counts, _ = _at_once(12, lambda i: clients[i].post(f"{urls[i % 2]}/api/counters/{name}/increment",
                                                       timeout=120).status_code)
    assert counts == [200] * 12
    assert _read(app, lambda: counters.exact_totals([name])[name]) == 12


HOLDER = textwrap.dedent("""
    import sys, time
    from google.cloud import ndb
    from core.runtime import Runtime
    from core.settings import Settings
    rt = Runtime(Settings.from_env())
    with rt.context():
        key = ndb.Key("BlogIndex", sys.argv[1])
        with rt.hot_entities.turn(key):
            print("held", flush=True)
            time.sleep(600)
""")


def test_a_process_killed_holding_the_turn_stalls_the_others_one_expiry_at_most(fleet):
    urls, app, env = fleet
    blog = f"orphan-{uuid.uuid4().hex[:8]}"
    admin = signed_in(urls[1], ADMIN, admin=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, blog], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.kill()  # SIGKILL: it gives nothing back
        holder.wait(timeout=10)
        started = time.monotonic()
        r = admin.post(f"{urls[1]}/api/blogs/{blog}/entries", json={"title": "t", "body": "b"}, timeout=60)
        waited = time.monotonic() - started
    finally:
        holder.kill()
    assert r.status_code == 201 and r.json()["index"] == 0
    # It waited for the dead holder's lease (so the turn reaches across processes), and no longer than its expiry.
    assert 1.0 <= waited <= hotspots.CLAIM_SECONDS + 3, f"waited {waited:.1f} s"
    assert _read(app, lambda: ndb.Key(BlogIndex, blog).get().max_index) == 0


def test_a_sign_out_answered_by_one_process_ends_the_cookie_in_every_other(fleet):
    """Sign-out's revocation across processes (core/identity.py): the cookie saved before a sign-out answered by one
    server is nobody's on both servers, each worker of each, though every one of them had it cached as good."""
    urls = fleet[0]
    browser = signed_in(urls[0], "ann@example.com")
    saved = browser.cookies.get("session")

    def who(url):
        return requests.get(f"{url}/api/session", cookies={"session": saved}, timeout=30).status_code
    assert [who(url) for url in urls * 4] == [200] * 8  # each worker reads (and caches) the generation
    assert browser.delete(f"{urls[1]}/api/session", timeout=30).status_code == 204
    assert [who(url) for url in urls * 4] == [401] * 8
