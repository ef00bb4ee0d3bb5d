"""What the tests share besides their fixtures (conftest.py): the settings of a test's app, a fresh datastore, the
OpenAPI contract check, the task queue a test drains, sign-in, CSRF tokens, threads. Public names: test modules import
them from here, never from conftest.
"""
import concurrent.futures
import contextlib
import inspect
import itertools
import json
import re
import threading
import time

from flask import request
from google.api_core import exceptions as core_exceptions
from google.cloud import ndb
from openapi_core import OpenAPI
from openapi_core.contrib.flask import FlaskOpenAPIRequest, FlaskOpenAPIResponse

from bench.harness import billed_from_header
from core import datastore, runtime, tasks, transactions
from devstack import taskqueue
from devstack.apps import app_on
from devstack.taskqueue import DrainedQueue

RULE_PARAMETER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")  # Flask's <int:index> is OpenAPI's {index}


# The suite writes far more as one person than anyone at a keyboard would (pages of comments, many counters, bursts of
# posts), so its apps raise the write budget (core/budget.py); tests/test_write_budget.py checks it with small figures
# of its own, and the defaults as documented. Apps served as processes pass it too (tests/test_processes.py).
WRITE_BUDGET = "comments=100000,counters=100000,posts=100000"
TEST_ENV = {"SECRET_KEY": "test-secret", "ADMIN_EMAILS": "boss@example.com", "WRITE_BUDGET": WRITE_BUDGET}


def settings_for(stack, **overrides):
    """The settings of a test's app on `stack`; `overrides` are environment variables."""
    return stack.settings(**{**TEST_ENV, **overrides})


class _RequestWithoutBody(FlaskOpenAPIRequest):
    """The request as openapi-core needs it to find the operation a response answers: its body is not needed (and
    reading a body the app refused as too large would only raise the 413 again)."""

    @property
    def body(self):
        return None


class ContractCheck:
    """Every response the app gives to a documented operation is validated against its OpenAPI document (openapi-core),
    and every /api route must be documented; what does not match is kept for the test's teardown to fail on."""
    _validators = {}  # document as JSON -> its validator: built once per session, not once per app

    def __init__(self, app):
        self.document = app.extensions["openapi"]
        key = json.dumps(self.document, sort_keys=True)
        if key not in self._validators:
            self._validators[key] = OpenAPI.from_dict(self.document)
        self.validator = self._validators[key]
        self.breaches = []
        self.checked = 0
        app.after_request(self)

    def __call__(self, response):
        if request.url_rule is None:  # no route matched (404, 405): no operation to hold it to
            return response
        path = RULE_PARAMETER.sub(r"{\1}", request.url_rule.rule)
        operation = self.document["paths"].get(path, {}).get(request.method.lower())
        where = f"{request.method} {request.full_path.rstrip('?')} -> {response.status_code}"
        if operation is None:
            if path.startswith("/api/"):
                self.breaches.append(f"{where}: the route is not in the OpenAPI document")
            return response
        try:
            self.validator.validate_response(_RequestWithoutBody(request), FlaskOpenAPIResponse(response))
            self.checked += 1
        except Exception as e:  # noqa: BLE001 - every kind of mismatch is reported, with its cause
            self.breaches.append(f"{where}: {e}; {e.__cause__ or ''} {getattr(e.__cause__, 'schema_errors', '')}")
        return response

    def assert_kept(self):
        assert not self.breaches, "responses that do not match the OpenAPI document:\n" + "\n".join(self.breaches)


def contract_checked(app):
    """`app`, its responses checked against its OpenAPI document; `app.extensions["contract"].assert_kept()` at the
    end of the test."""
    app.extensions["contract"] = ContractCheck(app)
    return app


def make_app(stack, checked=True, **overrides):
    """A test's app on `stack` (settings_for(stack, **overrides)), its tasks waiting in a DrainedQueue for the test
    to deliver, its responses held to the OpenAPI document when `checked`."""
    app = app_on(stack, task_queue=DrainedQueue(), **{**TEST_ENV, **overrides})
    return contract_checked(app) if checked else app


@contextlib.contextmanager
def running(app, flush=False):
    """The app's runtime current while the test runs (its services are called directly, as a request would), closed
    after; the responses' contract checked at the end."""
    rt = runtime.of(app)
    if flush:
        rt.cache.flush()
    with rt.activated():
        yield app
    rt.close()
    if "contract" in app.extensions:
        app.extensions["contract"].assert_kept()


class Tasks:
    """The test's task queue (devstack.taskqueue.DrainedQueue): tasks wait until `drain` delivers them through the
    app's task route, as a real queue would, on `workers` threads; `fail(task)` may make a delivery fail first."""

    def __init__(self, app):
        self.app = app
        rt = runtime.of(app)
        self.queue = rt.tasks.queue
        self.token = tasks.local_token(rt.settings.secret_key)
        self.responses = []
        self.timings = []  # each delivery's Server-Timing header

    def deliver(self, task):
        response = self.app.test_client().post(tasks.ROUTE.format(task.handler), data=task.body(),
                                               headers=taskqueue.local_headers(self.token, task))
        self.responses.append((task, response.status_code, response.get_json()))
        self.timings.append(response.headers.get("Server-Timing", ""))
        return 200 <= response.status_code < 300

    def post(self, handler, payload):
        """`payload` posted to `handler`'s task route as the queue would (its token), now: the app's response."""
        return self.app.test_client().post(tasks.ROUTE.format(handler), json=payload,
                                           headers={tasks.TOKEN_HEADER: self.token})

    def drain(self, workers=1, deliver=None, **limits):
        return self.queue.drain(deliver or self.deliver, workers=workers, **limits)


class Auth:
    def __init__(self, client):
        self.client = client

    def sign_in(self, email="user@example.com", admin=False):
        r = self.client.post("/api/session", json={"email": email, "admin": admin})
        assert r.status_code == 200, r.get_data(as_text=True)
        return r.get_json()["user"]

    def admin(self):
        return self.sign_in("boss@example.com", admin=True)

    def sign_out(self):
        assert self.client.delete("/api/session").status_code == 204


# What App Engine's settings need at the least (core/settings.py refuses to start without each): as on App Engine.
ON_APP_ENGINE = {"GAE_ENV": "standard", "SECRET_KEY": "s" * 32, "TASKS_LOCATION": "us-central1",
                 "GOOGLE_CLIENT_ID": "123456789-test.apps.googleusercontent.com"}


def csrf_token(client, path="/counters"):
    """The CSRF token a page's forms carry."""
    html = client.get(path).get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def at_once(count, fn):
    """fn(i) for i in range(count) on `count` threads released at the same moment: [(result, seconds)] in order."""
    barrier = threading.Barrier(count)

    def timed(i):
        barrier.wait()
        started = time.monotonic()
        result = fn(i)
        return result, time.monotonic() - started
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(timed, range(count)))


def writers_meet_before_writing(monkeypatch, at=(ndb, "put_multi"), parties=2, timeout=10.0) -> list:
    """The interleaving a lost update needs, forced: writers that take no turns (`core.transactions.in_turn`
    patched out, as for writers that each went on without their lease: core/hotspots.py) and whose first `parties`
    transactions wait, after their reads and before their writes (at `at`: `ndb.put_multi`, or a model's `put`),
    until every one of them has read. Later attempts (a retry after the collision) pass freely. A writer that never
    reaches the meeting (something still puts them in turns) breaks the barrier after `timeout` s and fails the test
    with BrokenBarrierError. Returns the list of the writers that met, for the test to check that its writes do pass
    `at` (when none does, nothing was forced)."""
    monkeypatch.setattr(transactions, "in_turn", lambda hot_key: contextlib.nullcontext())
    owner, name = at
    barrier, calls, write, met = threading.Barrier(parties), itertools.count(), getattr(owner, name), []

    def meeting(*args, **options):
        if next(calls) < parties:
            met.append(threading.get_ident())
            barrier.wait(timeout)
        return write(*args, **options)
    monkeypatch.setattr(owner, name, meeting)
    return met


def claimants_meet_at_the_claim(monkeypatch, cache, key, parties=2, timeout=10.0):
    """The interleaving a claim read and then written would need, forced: the first cache call on `key` (a get, an add
    or a set of `cache`, a core.cache.Cache) of each of the first `parties` threads, once answered, waits until every
    one of them has had its first answered, so a claim made of a read and then a write lets both through. Later calls,
    and other threads', pass freely. A claimant that never reaches the claim breaks the barrier after `timeout` s
    (BrokenBarrierError)."""
    barrier, lock, met = threading.Barrier(parties), threading.Lock(), set()

    def meeting(call):
        def called(called_key, *args, **kwargs):
            with lock:
                first = called_key == key and threading.get_ident() not in met and len(met) < parties
                if first:
                    met.add(threading.get_ident())
            answer = call(called_key, *args, **kwargs)
            if first:
                barrier.wait(timeout)
            return answer
        return called
    for name in ("get", "add", "set"):
        monkeypatch.setattr(cache, name, meeting(getattr(cache, name)))


MUTMUT_NAME = re.compile(r"x(?:_|ǁ\w+?ǁ)(\w+?)__mutmut_(?:orig|\d+)")  # how mutmut renames what it mutates


def plain_name(fn) -> str:
    """A function's `__qualname__` as its source names it, also while `make mutants` runs (mutmut's trampolines call
    `x_f__mutmut_orig` or a mutant `x_f__mutmut_3` in place of `f`)."""
    return MUTMUT_NAME.sub(r"\1", getattr(fn, "__qualname__", ""))


def commit_answers_unknown(monkeypatch, transaction):
    """The first transaction of the function named `transaction` (its `__qualname__`, a partial's too; for
    `core.exactly_once.once`, the name of its `write`) commits, and then its caller sees UNKNOWN, as when a commit
    applied but its answer was lost. Returns the list its committed result is appended to (empty while it has not
    happened)."""
    real, answered = ndb.transaction, []

    def applied_then_unknown(fn, **options):
        result = real(fn, **options)
        named = getattr(fn, "func", fn)
        if plain_name(named) == "once.<locals>.txn":  # core.exactly_once.once's: named by its `write`
            named = inspect.getclosurevars(named).nonlocals["write"]
        if plain_name(named) == transaction and not answered:
            answered.append(result)
            raise core_exceptions.Unknown("the commit's outcome is unknown")
        return result
    monkeypatch.setattr(ndb, "transaction", applied_then_unknown)
    return answered


def api_commit_answers_unknown(monkeypatch):
    """The next commit of a transaction on the Datastore API itself (core/datastore.Transaction: the mapper's
    increments jobs' chunks) applies, and then its caller sees UNKNOWN, as when a commit applied but its answer was
    lost. Returns the list the committed transaction's id is appended to (empty while it has not happened)."""
    real, answered = datastore.Transaction.commit, []

    def applied_then_unknown(transaction, mutations):
        answer = real(transaction, mutations)
        if not answered:
            answered.append(transaction.id)
            raise core_exceptions.Unknown("the commit's outcome is unknown")
        return answer
    monkeypatch.setattr(datastore.Transaction, "commit", applied_then_unknown)
    return answered


def another_commits_first(monkeypatch, commit):
    """While the next writer that takes turns at a hot entity (`core.transactions.in_turn`) waits for its turn,
    `commit()` runs and commits: another request's write lands between this call's start and its transaction, so
    whatever the call read before its turn is stale by then, and no collision tells it so (the other write committed
    before this transaction read anything). Returns the list `commit()`'s result is appended to."""
    real, started, done = transactions.in_turn, [], []

    def after_another(hot_key):
        if not started:
            started.append(True)  # commit()'s own turn is taken as usual
            done.append(commit())
        return real(hot_key)
    monkeypatch.setattr(transactions, "in_turn", after_another)
    return done


def in_threads(count, fn):
    """Run fn(i) for i in range(count) on `count` threads at once, each in its own ndb context; their results."""
    return runtime.current().map_in_threads(fn, range(count))


# --- a response's costs, from its Server-Timing header -------------------------------------------------------

METRIC = re.compile(r'(?P<name>[\w-]+);desc="(?P<desc>[^"]*)";dur=(?P<dur>[\d.]+)')


def timing(response):
    """{metric: (count, {what: n}, ms)} from a response's Server-Timing header (the app metric has no count)."""
    header = response.headers["Server-Timing"]
    found = {}
    for m in METRIC.finditer(header):
        count, _, detail = m["desc"].partition(": ")
        by = {what: int(n) for n, what in (part.split(" ", 1) for part in detail.split(", ") if part)}
        found[m["name"]] = (int(count.split()[0]), by, float(m["dur"]))
    app_ms = re.search(r"app;dur=([\d.]+)", header)
    found["app"] = float(app_ms[1])
    return found


def billed(response):
    """(reads, writes, deletes, USD per million) from a response's Server-Timing `billed` metric; the dollars as the
    header states them."""
    header = response.headers["Server-Timing"]
    bill = billed_from_header(header)
    usd = re.search(r'billed;desc="[^"]*\$([\d.]+) per million', header)
    assert usd or "nothing in Datastore" in header, header
    return bill.reads, bill.writes, bill.deletes, float(usd[1]) if usd else 0.0
