"""schemathesis fuzzes every operation of the OpenAPI document against the app served over HTTP on loopback, signed in
as a user and as an admin: no answer may be a server error (5xx), every answer must match the document (status,
content type, headers, body schema), and no request the document calls invalid may be answered 2xx. Bounded: EXAMPLES
per operation (fewer for the costly ones), one deadline per request; derandomized, so that CI runs the same cases each
time.

Each operation draws from three sources: schema-valid input (positive), schema-invalid input (negative: wrong types,
missing fields, bad bodies), and valid input aimed at resources that exist (the demo blog's entry 0, a counter, a job),
so that the fuzzing reaches past the 404s.
"""
import collections
import json
import time

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import checks as schemathesis_checks
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode

from core import runtime, tasks, web
from devstack import serving
from tests.support import make_app

EXAMPLES = 30
# Each example of these does real work (up to 500 concurrent increments; a whole latency measurement).
COSTLY = {"burstCounter": 6, "measureNumbers": 4}
DEADLINE_MS = 20_000
# negative_data_rejection: a request the document calls invalid (a string where it says integer, a field missing, a
# value out of range) must not be answered 2xx, so the contract's types are the server's too (issue 57: "500" for
# page_size and "3" for count were started, a 202). Its expected statuses are schemathesis' defaults, 4xx and 5xx
# (a 5xx is not_a_server_error's to refuse).
CHECKS = [schemathesis_checks.not_a_server_error, schemathesis_checks.status_code_conformance,
          schemathesis_checks.content_type_conformance, schemathesis_checks.response_headers_conformance,
          schemathesis_checks.response_schema_conformance, schemathesis_checks.negative_data_rejection]
USERS = {"user": ("fuzz-user@example.com", False), "admin": ("boss@example.com", True)}


@pytest.fixture
def served_app(stack):
    """The app on a loopback port, over a fresh datastore and cache, with demo resources to aim at. Its task queue only
    holds tasks (nothing delivers them), so fuzzed seeds and jobs cost nothing."""
    fresh = stack.fresh()

    def on(tasks_env):
        app = make_app(stack, **fresh)
        runtime.of(app).cache.flush()
        return app
    with serving.served(on) as (app, url):
        yield app, url
    app.extensions["contract"].assert_kept()


def _sign_in(url, role):
    email, admin = USERS[role]
    session = requests.Session()
    session.post(f"{url}/api/session", json={"email": email, "admin": admin}, timeout=10).raise_for_status()
    return session.cookies.get_dict()


def _resources(url, admin_cookies):
    """A blog entry with a comment, a counter and a job: their ids for the aimed cases."""
    with requests.Session() as s:
        s.cookies.update(admin_cookies)
        s.post(f"{url}/api/blogs/demo/entries", json={"title": "Fuzzed", "body": "An entry to aim at."},
               timeout=10).raise_for_status()
        comment = s.post(f"{url}/api/blogs/demo/entries/0/comments", json={"text": "hello"}, timeout=10)
        comment.raise_for_status()
        s.put(f"{url}/api/counters/likes", json={"mode": "adaptive"}, timeout=10).raise_for_status()
        s.post(f"{url}/api/accounts/seed", json={"count": 1}, timeout=10).raise_for_status()
        job = s.post(f"{url}/api/jobs", json={"name": "recount_comments"}, timeout=10)
        job.raise_for_status()
    return {"blog": "demo", "index": "0", "name": "likes", "job_id": job.json()["id"]}


def _fuzzer(label, strategy, url, cookies, cases):
    """The hypothesis test of one operation: each case called on the served app and held to the document."""
    @settings(max_examples=COSTLY.get(label, EXAMPLES), deadline=DEADLINE_MS, derandomize=True, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        # A case made invalid by leaving out the session cookie is sent without the fuzzer's own (which would put it
        # back), so that it meets the 401 the document promises.
        signed_out = case.meta is not None and case.meta.is_negative_at(ParameterLocation.COOKIE)
        response = case.call(base_url=url, cookies=None if signed_out else cookies, timeout=30)
        case.validate_response(response, checks=CHECKS)
        cases[label] += 1
    return run


@pytest.mark.parametrize("role", ["user", "admin"])
def test_every_operation_fuzzed_without_server_errors_or_contract_breaches(served_app, role):
    app, url = served_app
    schema = schemathesis.openapi.from_dict(app.extensions["openapi"])
    cookies = _sign_in(url, role)
    known = _resources(url, _sign_in(url, "admin"))
    cases = collections.Counter()
    started = time.monotonic()
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        label = operation.definition.raw.get("operationId", operation.label)
        aimed = {name: value for name, value in known.items()
                 if name in {p.name for p in operation.path_parameters}}
        strategy = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                             operation.as_strategy(GenerationMode.NEGATIVE),
                             operation.as_strategy(GenerationMode.POSITIVE, path_parameters=aimed))

        _fuzzer(label, strategy, url, cookies, cases)()
    print(f"\nschemathesis as {role}: {sum(cases.values())} cases over {len(cases)} operations in "
          f"{time.monotonic() - started:.0f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(cases.items())))
    assert len(cases) == len(operations)  # every operation was exercised


# --- hostile requests the fuzzer does not make ----------------------------------------------------------------------

NESTED = b"[" * 50_000  # a JSON body nested past Python's recursion limit


def _body_limit(app, method, path):
    """The body limit of the route that serves `method path` (core/web.body_limit)."""
    endpoint, _ = app.url_map.bind("localhost").match(path, method=method.upper())
    return getattr(app.view_functions[endpoint], "body_limit", web.BODY_BYTES)


def _uncached(value):
    """`value` without what changes by itself: "cached" flags (where an answer came from) and a job's "elapsed"."""
    if isinstance(value, dict):
        return {k: _uncached(v) for k, v in value.items() if k not in ("cached", "elapsed")}
    return [_uncached(v) for v in value] if isinstance(value, list) else value


def _state(url, cookies):
    """What the unsafe operations could change, as the API shows it (the task queue only holds tasks here)."""
    with requests.Session() as s:
        s.cookies.update(cookies)
        return [_uncached(s.get(f"{url}{path}", timeout=10).json()) for path in (
            "/api/counters", "/api/counters/likes", "/api/blogs/demo/entries", "/api/blogs/demo/entries/0/comments",
            "/api/jobs", "/api/accounts/summary", "/api/simple-counter")]


def test_hostile_requests_to_every_unsafe_operation_are_refused_and_change_nothing(served_app):
    """Every POST, PUT and DELETE of the document, as an admin whose browser is made to send it by another site's
    page (a bodyless `fetch(..., {mode: "no-cors", credentials: "include"})` or a `sendBeacon`): 403 `cross_site`,
    by Sec-Fetch-Site or, where a browser sends no Fetch Metadata, by Origin. Then, same-site, a JSON body nested
    50,000 deep: 400, never a RecursionError's 500. And headers with a non-ASCII byte: the task token 403, an
    Idempotency-Key 400. Afterwards the API shows exactly what it showed before."""
    app, url = served_app
    admin = _sign_in(url, "admin")
    _resources(url, admin)
    known = {"blog": "demo", "index": "0", "name": "likes", "job_id": "0123456789abcdef"}
    schema = schemathesis.openapi.from_dict(app.extensions["openapi"])
    token = tasks.local_token(runtime.of(app).settings.secret_key)
    before = _state(url, admin)
    unsafe = [op for op in (r.ok() for r in schema.get_all_operations()) if op.method.upper() in ("POST", "PUT",
                                                                                                  "DELETE")]
    assert len(unsafe) >= 15, [op.label for op in unsafe]
    cross_site = ({"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, {"Origin": "https://evil.example"},
                  {"Origin": "null"})
    with requests.Session() as s:
        s.cookies.update(admin)
        for op in unsafe:
            params = {p.name: known.get(p.name, "x") for p in op.path_parameters}
            if op.path.startswith("/api/tasks/"):
                params["name"] = "mapper.run"
            path = url + op.path.format(**params)
            for headers in cross_site:
                r = s.request(op.method.upper(), path, headers=headers, timeout=10)
                assert r.status_code == 403 and r.json()["error"]["code"] == "cross_site", (op.label, headers, r.text)
            if op.body:  # as the queue sends a task, where the operation is the task route
                r = s.request(op.method.upper(), path, data=NESTED, timeout=10,
                              headers={"Content-Type": "application/json", tasks.TOKEN_HEADER: token})
                # parsed (and refused) where the route's body limit lets it in, else refused unparsed
                expected = 400 if len(NESTED) <= _body_limit(app, op.method, path[len(url):]) else 413
                assert r.status_code == expected, (op.label, r.status_code, r.text[:200])
        r = s.post(f"{url}/api/counters/likes/increment", headers={"Idempotency-Key": "caf\xe9"}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_idempotency_key", r.text
        r = s.post(f"{url}/api/tasks/mapper.run", headers={"X-Tasks-Token": "\xff" * 64}, json={}, timeout=10)
        assert r.status_code == 403, r.text
    assert _state(url, admin) == before


@pytest.mark.parametrize("query", ["shards=", "shards=yes", "shards=2"])
def test_a_query_value_the_document_does_not_list_is_refused(client, auth, query):
    """`?shards=` takes what the document's enum lists (1, true, 0, false); anything else was read as "no" and
    answered 200, which schemathesis' negative_data_rejection found."""
    auth.admin()
    assert client.put("/api/counters/likes", json={"mode": "general"}).status_code in (200, 201)
    for path in ("/api/simple-counter", "/api/counters/likes"):
        r = client.get(f"{path}?{query}")
        assert r.status_code == 400 and r.get_json()["error"]["code"] == "bad_shards", (path, r.get_data(as_text=True))
    assert "shards" not in client.get("/api/counters/likes?shards=false").get_json()


def test_a_chunked_body_past_a_routes_limit_is_a_413_never_a_cut_body_parsed(served_app):
    """A body sent without a Content-Length (Transfer-Encoding: chunked, as a generator's body goes out) is held to
    the route's limit too: werkzeug's stream stops at the limit without a word, and `/api/plan` parsed the cut JSON (a
    400) and a form's CSRF check the cut form. Now a 413 before any parsing, and a chunked body within the limit is
    read whole, JSON or form."""
    app, url = served_app

    def chunked(body):
        return (body[i:i + 1000] for i in range(0, len(body), 1000))
    plan = {"planner": "counter", "inputs": {"writes_per_second": 50, "peak_seconds": 60}}
    big = json.dumps({**plan, "padding": "x" * web.BODY_BYTES}).encode()
    json_type = {"Content-Type": "application/json"}
    r = requests.post(f"{url}/api/plan", data=chunked(big), headers=json_type, timeout=10)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_entity_too_large", r.text[:200]
    r = requests.post(f"{url}/api/plan", data=chunked(json.dumps(plan).encode()), headers=json_type, timeout=10)
    assert r.status_code == 200 and r.json()["planner"] == "counter", r.text[:200]
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = requests.post(f"{url}/signin", data=chunked(b"email=a%40b.example&next=" + b"x" * web.BODY_BYTES),
                      headers=form, timeout=10)
    assert r.status_code == 413, r.text[:200]
    r = requests.post(f"{url}/signin", data=chunked(b"email=a%40b.example"), headers=form, timeout=10)
    assert r.status_code == 400 and "out of date" in r.text  # read whole, and refused for its missing CSRF token
