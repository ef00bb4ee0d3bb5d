"""One Idempotency-Key contract on every endpoint that takes one (core/idempotency.py, docs/api.md#idempotency-key):
counter increments, posts, comments, job starts and seeds. For each: two callers' equal keys are two requests; the
same request sent again answers the first answer with the same status every time; the key sent with other content or
for another target is a 409 that writes nothing; a reserved-looking key (`__k__`) is a key like any other. And an
anonymous increment may not carry a key at all."""
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from accounts.models import SeedMarker
from blog.models import BlogEntry, PostMarker
from comments.models import Comment, CommentMarker
from core import idempotency, runtime
from counters import totals
from counters.models import AppliedIncrement
from mapper.models import MapperJob

REPLAYED = idempotency.REPLAYED_HEADER


def _in_context(fn):
    with runtime.current().context():
        return fn()


@dataclasses.dataclass
class Endpoint:
    """One endpoint as the contract sees it: who may call it, what it answers, how a request is sent (`variant`:
    None for the request itself, "content" or "target" for the same key with other content or another target), and
    how many effects are stored."""
    name: str
    status: int
    callers: tuple[tuple[str, bool], tuple[str, bool]]  # two (email, admin)
    send: Callable[[Any, dict[str, str], str | None], Any]
    effects: Callable[[], int]
    markers: Callable[[], list]  # the stored markers' key names
    variants: tuple[str, ...] = ("content",)
    prepare: Callable[[Any, Any], None] = lambda client, auth: None
    same: Callable[[dict], object] = lambda body: body  # what must be equal between the first answer and a replay


def _counter_prepare(client, auth):
    auth.admin()
    for name in ("idem-a", "idem-b"):
        assert client.put(f"/api/counters/{name}", json={"mode": "general"}).status_code == 200


def _blog_prepare(client, auth):
    auth.admin()
    for title in ("zero", "one"):  # entries 0 and 1 of blog "talk", for comments to land on
        assert client.post("/api/blogs/talk/entries", json={"title": title, "body": "b"}).status_code == 201


def _count_counters():
    found = _in_context(lambda: totals.exact_totals(["idem-a", "idem-b"]))
    return found["idem-a"] + found["idem-b"]


def _names(kind):
    return lambda: [key.id() for key in _in_context(lambda: kind.query().fetch(keys_only=True))]


ENDPOINTS = [
    Endpoint("increment", 200, (("user@example.com", False), ("other@example.com", False)),
             lambda client, key, variant: client.post(
                 f"/api/counters/{'idem-b' if variant == 'target' else 'idem-a'}/increment", headers=key),
             _count_counters, _names(AppliedIncrement), variants=("target",), prepare=_counter_prepare),
    Endpoint("post", 201, (("boss@example.com", True), ("other-boss@example.com", True)),
             lambda client, key, variant: client.post(
                 f"/api/blogs/{'other' if variant == 'target' else 'idem'}/entries",
                 json={"title": "another title" if variant == "content" else "a title", "body": "a body"},
                 headers=key),
             lambda: len(_in_context(lambda: BlogEntry.query().fetch(keys_only=True))), _names(PostMarker),
             variants=("content", "target")),
    Endpoint("comment", 201, (("user@example.com", False), ("other@example.com", False)),
             lambda client, key, variant: client.post(
                 f"/api/blogs/talk/entries/{1 if variant == 'target' else 0}/comments",
                 json={"text": "another text" if variant == "content" else "a comment"}, headers=key),
             lambda: len(_in_context(lambda: Comment.query().fetch(keys_only=True))), _names(CommentMarker),
             variants=("content", "target"), prepare=_blog_prepare),
    Endpoint("job start", 202, (("boss@example.com", True), ("other-boss@example.com", True)),
             lambda client, key, variant: client.post(
                 "/api/jobs", json={"name": "add_credit", "params": {"amount": 4 if variant == "content" else 3}},
                 headers=key),
             lambda: len(_in_context(lambda: MapperJob.query().fetch(keys_only=True))), _names(MapperJob),
             same=lambda body: body["id"]),  # the job's figures move on; the job is the same one
    Endpoint("seed", 202, (("boss@example.com", True), ("other-boss@example.com", True)),
             lambda client, key, variant: client.post(
                 "/api/accounts/seed", json={"count": 4 if variant == "content" else 3}, headers=key),
             lambda: len(_in_context(lambda: SeedMarker.query().fetch(keys_only=True))), _names(SeedMarker)),
]


@pytest.fixture(params=ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def endpoint(request, client, auth, task_queue):
    request.param.prepare(client, auth)
    return request.param


def _sign_in(auth, caller):
    email, admin = caller
    return auth.sign_in(email, admin=admin)


def _before(endpoint):
    return endpoint.effects()


def test_a_replay_answers_the_first_answer_with_its_status_every_time(client, auth, endpoint):
    _sign_in(auth, endpoint.callers[0])
    before = _before(endpoint)
    key = {"Idempotency-Key": "order-42"}
    answers = [endpoint.send(client, key, None) for _ in range(3)]
    assert [a.status_code for a in answers] == [endpoint.status] * 3, [a.get_json() for a in answers]
    assert [a.headers.get(REPLAYED) for a in answers] == [None, "true", "true"]
    assert len({repr(endpoint.same(a.get_json())) for a in answers}) == 1
    assert endpoint.effects() == before + 1


def test_two_callers_with_one_key_each_get_their_own(client, auth, endpoint):
    """docs/api.md's own example key, `order-42`, from two callers: two effects, neither answered as a replay."""
    before = _before(endpoint)
    key = {"Idempotency-Key": "order-42"}
    answers = []
    for caller in endpoint.callers:
        _sign_in(auth, caller)
        answers.append(endpoint.send(client, key, None))
    assert [a.status_code for a in answers] == [endpoint.status] * 2, [a.get_json() for a in answers]
    assert [a.headers.get(REPLAYED) for a in answers] == [None, None]
    assert endpoint.effects() == before + 2 and len(endpoint.markers()) == 2


def test_the_key_sent_with_other_content_or_for_another_target_is_a_409_and_writes_nothing(client, auth, endpoint):
    _sign_in(auth, endpoint.callers[0])
    before = _before(endpoint)
    key = {"Idempotency-Key": "order-42"}
    first = endpoint.send(client, key, None)
    assert first.status_code == endpoint.status
    for variant in endpoint.variants:
        refused = endpoint.send(client, key, variant)
        assert refused.status_code == 409, (variant, refused.get_json())
        assert refused.get_json()["error"]["code"] == "idempotency_key_reused"
    assert endpoint.effects() == before + 1
    again = endpoint.send(client, key, None)  # the request itself is still answered as the first time
    assert again.status_code == endpoint.status and again.headers.get(REPLAYED) == "true"
    assert endpoint.same(again.get_json()) == endpoint.same(first.get_json())


def test_a_reserved_looking_key_is_a_key_like_any_other(client, auth, endpoint):
    """Datastore reserves key names `__...__`; a marker's name is a digest of (caller, endpoint, key), never the key,
    so `__k__` is taken, applied once and replayed like any key, and no stored name is reserved."""
    _sign_in(auth, endpoint.callers[0])
    before = _before(endpoint)
    answers = [endpoint.send(client, {"Idempotency-Key": "__k__"}, None) for _ in range(2)]
    assert [a.status_code for a in answers] == [endpoint.status] * 2, [a.get_json() for a in answers]
    assert answers[1].headers.get(REPLAYED) == "true" and endpoint.effects() == before + 1
    assert all(not str(name).startswith("__") for name in endpoint.markers())


def test_a_marker_name_is_unambiguous_and_never_reserved():
    """Length-prefixed parts, then a digest: ("a|b", "c") and ("a", "b|c") are different callers' keys, and every
    name is 64 hex digits."""
    names = {idempotency.marker_name("a|b", "counters.increment", "c"),
             idempotency.marker_name("a", "counters.increment", "b|c"),
             idempotency.marker_name("a", "blog.post", "b|c"),
             idempotency.marker_name("1:a", "counters.increment", "c")}
    assert len(names) == 4 and all(len(n) == 64 and set(n) <= set("0123456789abcdef") for n in names)


def test_an_anonymous_increment_with_a_key_is_a_401_and_counts_nothing(client, auth):
    """An anonymous caller has nothing a key could be its own under (an address is shared, a cookie dropped): the
    header is refused, never silently shared with every other anonymous caller. Without it the increment counts."""
    _counter_prepare(client, auth)
    auth.sign_out()
    refused = client.post("/api/counters/idem-a/increment", headers={"Idempotency-Key": "order-42"})
    assert refused.status_code == 401 and refused.get_json()["error"]["code"] == "sign_in_for_idempotency_key"
    assert _count_counters() == 0 and _names(AppliedIncrement)() == []
    assert client.post("/api/counters/idem-a/increment").status_code == 200 and _count_counters() == 1
