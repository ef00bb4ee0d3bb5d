"""/api/jobs, /api/accounts, the task route, the jobs and accounts pages; devstack's local Cloud Tasks end to end."""
import dataclasses
import re
import time

import pytest
from google.cloud import ndb

from accounts import demo as accounts_demo
from accounts import service as accounts_service
from accounts.credit import ADD_CREDIT, CREDIT_CHUNK
from accounts.models import Account
from blog import service as blog_service
from blog.models import EntryRef
from comments import recount as comments_recount
from comments import service as comments_service
from core import runtime, tasks
from counters.models import CounterConfig
from devstack import serving, taskqueue
from devstack.apps import app_on
from devstack.services import REPO
from mapper import jobs as mapper_jobs
from mapper.models import MapperJob
from tests.support import TEST_ENV, billed, commit_answers_unknown, csrf_token

USER = {"id": "u1", "email": "reader@example.com", "admin": False}


def job_count():
    with runtime.current().context():
        return len(MapperJob.query().fetch(keys_only=True))


@pytest.mark.parametrize("body,code", [
    ({"name": "no_such_job", "params": {}}, "no_such_job"),
    ({"params": {"amount": 1}}, "no_such_job"),
    ({"name": "add_credit", "params": []}, "bad_params"),
    ({"name": "add_credit", "params": {}}, "bad_amount"),
    ({"name": "add_credit", "params": {"amount": 0}}, "bad_amount"),
    ({"name": "add_credit", "params": {"amount": -5}}, "bad_amount"),
    ({"name": "add_credit", "params": {"amount": "10"}}, "bad_amount"),  # a number in JSON is a JSON number
    ({"name": "add_credit", "params": {"amount": True}}, "bad_amount"),
    ({"name": "add_credit", "params": {"amount": 1.5}}, "bad_amount"),
    ({"name": "add_credit", "params": {"amount": 10 ** 7}}, "bad_amount"),
    ({"name": "add_credit", "params": {"amount": 1, "extra": 1}}, "bad_params"),
    ({"name": "add_credit", "params": {"amount": 1}, "page_size": 0}, "bad_page_size"),
    ({"name": "add_credit", "params": {"amount": 1}, "page_size": 501}, "bad_page_size"),
    ({"name": "add_credit", "params": {"amount": 1}, "fanout": 1}, "bad_fanout"),
    ({"name": "add_credit", "params": {"amount": 1}, "fanout": 17}, "bad_fanout"),
    # The contract says integer: a string of digits is refused (issue 57: "500" was started, a 202).
    ({"name": "add_credit", "params": {"amount": 1}, "page_size": "500"}, "bad_page_size"),
    ({"name": "add_credit", "params": {"amount": 1}, "fanout": "4"}, "bad_fanout"),
    ({"name": "add_credit", "params": {"amount": 1}, "page_size": 50.0}, "bad_page_size"),
    ({"name": "recount_comments", "params": {"amount": 1}}, "bad_params"),
])
def test_bad_job_requests_are_422_and_start_nothing(client, auth, task_queue, body, code):
    auth.admin()
    r = client.post("/api/jobs", json=body)
    assert r.status_code == 422, r.get_json()  # a bad value in a body that parsed, as on every route
    assert r.get_json()["error"]["code"] == code
    assert job_count() == 0 and not task_queue.queue.pending
    with runtime.current().context():
        assert CounterConfig.query().fetch(keys_only=True) == []  # nor the figures a credit job keeps


def test_starting_a_job_needs_an_admin_and_json(client, auth, task_queue):
    assert client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 1}}).status_code == 401
    auth.sign_in()
    assert client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 1}}).status_code == 403
    auth.admin()
    assert client.post("/api/jobs", data="name=add_credit",
                       content_type="application/x-www-form-urlencoded").status_code == 415
    assert job_count() == 0 and not task_queue.queue.pending


def test_job_lookup_errors(client, auth):
    assert client.get("/api/jobs/0123456789abcdef").status_code == 404
    r = client.get("/api/jobs/not-an-id")
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "bad_job_id"
    auth.sign_in()
    assert client.post("/api/jobs/0123456789abcdef/cancel").status_code == 403


def test_job_listing_newest_first(client, auth, task_queue):
    auth.admin()
    ids = [client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": n}}).get_json()["id"]
           for n in (1, 2)]
    listed = client.get("/api/jobs").get_json()["jobs"]
    assert [j["id"] for j in listed] == ids[::-1]
    assert set(listed[0]) >= {"id", "name", "state", "processed", "progress", "tasks", "depth"}


def test_the_task_route_only_answers_the_queue(client, auth, app):
    auth.admin()
    payload = {"job": "0123456789abcdef", "path": "0", "lo": None, "hi": None, "weight": 1}
    assert client.post("/api/tasks/mapper.run", json=payload).status_code == 403
    assert client.post("/api/tasks/mapper.run", json=payload,
                       headers={tasks.TOKEN_HEADER: "forged"}).status_code == 403
    # A header may carry any byte: a token that is not ASCII is refused like any other (it was a 500).
    assert client.post("/api/tasks/mapper.run", json=payload,
                       headers={tasks.TOKEN_HEADER: "t\u00e9"}).status_code == 403
    good = {tasks.TOKEN_HEADER: tasks.local_token(runtime.of(app).settings.secret_key)}
    assert client.post("/api/tasks/nothing", json=payload, headers=good).status_code == 404
    r = client.post("/api/tasks/mapper.run", json=payload, headers=good)
    assert r.status_code == 200 and "skipped" in r.get_json()  # no such job: nothing to do, and no retry


def test_a_resent_job_start_answers_the_first_job(client, auth, task_queue):
    """The same Idempotency-Key twice: 202 with the same job both times, one job and one root task; another user's
    same key is another job; the key reused for another job, or for the same job with other settings, is a 409; a
    bad key a 400 that starts nothing."""
    with runtime.current().context():
        ndb.put_multi([Account(balance=0) for _ in range(5)])
    auth.admin()
    body, key = {"name": "add_credit", "params": {"amount": 3}}, {"Idempotency-Key": "start-once"}
    first = client.post("/api/jobs", json=body, headers=key)
    again = client.post("/api/jobs", json=body, headers=key)
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.get_json()["id"] == first.get_json()["id"] and job_count() == 1
    assert [t.name for t in task_queue.queue.pending] == [f"{first.get_json()['id']}-0"]  # one root task
    assert client.post("/api/jobs", json={"name": "audit_accounts"}, headers=key).status_code == 409
    # the same job with other settings (a form brought back by the browser's Back button and changed): not the first
    for changed in ({**body, "params": {"amount": 4}}, {**body, "page_size": 7}):
        refused = client.post("/api/jobs", json=changed, headers=key)
        assert refused.status_code == 409 and refused.get_json()["error"]["code"] == "idempotency_key_reused"
    assert job_count() == 1
    assert client.post("/api/jobs", json=body, headers={"Idempotency-Key": "has space"}).status_code == 400
    auth.sign_in("other-boss@example.com", admin=True)
    other = client.post("/api/jobs", json=body, headers=key)
    assert other.status_code == 202 and other.get_json()["id"] != first.get_json()["id"] and job_count() == 2
    task_queue.drain(workers=2)
    with runtime.current().context():
        assert sorted(a.balance for a in Account.query()) == [6] * 5  # two jobs, each once


def test_a_resent_credit_form_redirects_to_the_first_job(client, auth, task_queue):
    """The /accounts credit form sent twice (same csrf and start tokens): both redirect to one job."""
    auth.admin()
    html = client.get("/accounts").get_data(as_text=True)
    form = re.search(r'action="/accounts/credit".*?name="csrf_token" value="([^"]+)".*?'
                     r'name="start_token" value="([^"]+)"', html, re.S)
    data = {"amount": "7", "csrf_token": form.group(1), "start_token": form.group(2)}
    first, again = client.post("/accounts/credit", data=data), client.post("/accounts/credit", data=data)
    assert first.status_code == again.status_code == 302 and first.headers["Location"] == again.headers["Location"]
    assert job_count() == 1
    fresh = client.get("/accounts").get_data(as_text=True)  # a new page: a new token, a new job
    assert re.findall(r'name="start_token" value="([^"]+)"', fresh)[0] != form.group(2)


def test_a_resent_seed_seeds_nothing_more(client, auth, task_queue):
    auth.admin()
    key = {"Idempotency-Key": "seed-once"}
    first = client.post("/api/accounts/seed", json={"count": 30}, headers=key)
    again = client.post("/api/accounts/seed", json={"count": 30}, headers=key)
    assert first.status_code == again.status_code == 202 and first.get_json() == again.get_json()
    seeding = [t for t in task_queue.queue.pending if t.handler == "accounts.seed"]
    assert len(seeding) == 1  # the resend's task had the same name (beside it: the hour's marker sweep)
    task_queue.drain()
    assert client.get("/api/accounts/summary").get_json()["count"] == 30


def test_the_sweep_answers_only_the_scheduler(client, auth, app):
    """GET /api/jobs/sweep writes (App Engine's cron sends only GETs): anyone but the app's scheduler gets a 403."""
    auth.admin()
    assert client.get("/api/jobs/sweep").status_code == 403
    assert client.get("/api/jobs/sweep", headers={"X-Appengine-Cron": "true"}).status_code == 403  # not on GAE
    good = {tasks.TOKEN_HEADER: tasks.local_token(runtime.of(app).settings.secret_key)}
    r = client.get("/api/jobs/sweep", headers=good)
    assert r.status_code == 200 and r.get_json() == {"revived": [], "failed": [], "summed": [], "follow_ups": []}


def test_the_cron_schedule_is_the_sweep_setting(tmp_path):
    """cron.yaml says what core/settings.py's default says; the local task server takes the setting when it is set."""
    from core.settings import MAPPER_SWEEP_SECONDS
    from devstack import cloudtasks
    with pytest.MonkeyPatch.context() as patch:  # the schedule as cron.yaml writes it, no setting put in its place
        patch.setattr(cloudtasks, "SCHEDULE_SETTINGS", {})
        assert cloudtasks.load_cron(REPO / "cron.yaml", env={}) == [("/api/jobs/sweep", MAPPER_SWEEP_SECONDS)]
    assert cloudtasks.load_cron(REPO / "cron.yaml", env={}) == [("/api/jobs/sweep", MAPPER_SWEEP_SECONDS)]
    assert cloudtasks.load_cron(REPO / "cron.yaml", env={"MAPPER_SWEEP_SECONDS": "2"}) == [("/api/jobs/sweep", 2)]
    (tmp_path / "cron.yaml").write_text("cron:\n- url: /x\n  schedule: every monday 09:00\n")
    with pytest.raises(ValueError, match="schedule"):
        cloudtasks.load_cron(tmp_path / "cron.yaml")


# --- accounts ---------------------------------------------------------------------------------------------------------

def test_seed_accounts_in_the_background_exactly(client, auth, task_queue):
    auth.admin()
    r = client.post("/api/accounts/seed", json={"count": 1234})
    assert r.status_code == 202 and r.get_json()["tasks"] == 3
    assert client.get("/api/accounts/summary").get_json() == {"count": 0, "total_balance": 0}
    first = task_queue.queue.pending[0]
    task_queue.drain(workers=2)
    assert task_queue.deliver(first)  # delivered again (a queue may): no account twice
    assert client.get("/api/accounts/summary").get_json() == {"count": 1234, "total_balance": 0}


def test_a_seed_task_delivered_again_after_a_credit_leaves_the_credited_balances_alone(client, auth, task_queue):
    """A queue may deliver a seed task again long after it ran, when its accounts have been credited since: the
    redelivery finds them and writes none of them again (a fresh Account would zero its balance), and the kept figures
    and the audit still agree with the accounts."""
    auth.admin()
    assert client.post("/api/accounts/seed", json={"count": 30}).status_code == 202
    seed_task = task_queue.queue.pending[0]
    task_queue.drain()
    job = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 7}}).get_json()
    task_queue.drain()
    assert client.get(f"/api/jobs/{job['id']}").get_json()["state"] == "done"
    assert task_queue.deliver(seed_task) and task_queue.responses[-1][2] == {"created": 0}
    with runtime.current().context():
        assert sorted(a.balance for a in Account.query()) == [7] * 30
    assert client.get("/api/accounts/summary").get_json() == {"count": 30, "total_balance": 210}
    assert _audit(client, task_queue)["ok"] is True


def test_every_chunk_fits_legacys_25_entity_groups(app, client, auth, task_queue):
    """A transaction on the legacy emulator (Datastore before Firestore) may touch 25 entity groups: a job whose chunk
    would not leave room for its task's record is refused when it is registered, and a full seed chunk (its accounts,
    the kept count's config and shard) and a full credit chunk (its accounts and the task's record) each commit in one
    delivery."""
    with pytest.raises(ValueError, match="does not fit"):
        too_wide = dataclasses.replace(ADD_CREDIT, name="too_wide", per_transaction=mapper_jobs.MAX_GROUPS)
        mapper_jobs.register(app, too_wide)
    auth.admin()
    count = max(accounts_service.SEED_CHUNK, CREDIT_CHUNK) + 1  # a full chunk of each, and one more
    assert client.post("/api/accounts/seed", json={"count": count}).status_code == 202
    assert task_queue.deliver(task_queue.queue.take())  # the first delivery: no retry to hide a refused commit
    assert task_queue.responses[-1][2] == {"created": count}
    job = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 2}}).get_json()
    assert task_queue.deliver(task_queue.queue.take())  # the root: its page is every account, a full chunk first
    with runtime.current().context():
        assert sorted(a.balance for a in Account.query()) == [2] * count
    assert client.get(f"/api/jobs/{job['id']}").get_json()["processed"] == count


def test_a_seed_chunk_whose_commit_answered_unknown_reports_what_it_created(client, auth, task_queue, monkeypatch):
    """A seed chunk's commit answers UNKNOWN though it applied: its retry finds the accounts it created itself and
    counts them in the task's report (it reported fewer), and the kept count stays exact."""
    auth.admin()
    assert client.post("/api/accounts/seed", json={"count": 50}).status_code == 202
    answered = commit_answers_unknown(monkeypatch, "_create_missing.<locals>.create")
    task_queue.drain()
    monkeypatch.undo()
    reports = [body for task, status, body in task_queue.responses if task.handler == "accounts.seed"]
    assert answered and reports == [{"created": 50}]
    assert client.get("/api/accounts/summary").get_json()["count"] == 50


@pytest.mark.parametrize("body", [{"count": 0}, {"count": 100001}, {"count": "x"}, {"count": None}, {}, {"count": -1},
                                  {"count": "3"}, {"count": 3.0}, {"count": True}])
def test_bad_seed_requests(client, auth, task_queue, body):
    """{"count": "3"} was seeded (a 202) though the contract says integer (issue 57)."""
    auth.admin()
    r = client.post("/api/accounts/seed", json=body)
    assert r.status_code == 422 and r.get_json()["error"]["code"] == "bad_count"
    assert not task_queue.queue.pending


@pytest.mark.parametrize("payload", [
    {"seed": "x", "start": 0, "stop": 1_000_000_000}, {"seed": "x", "start": 5, "stop": 5},
    {"seed": "x", "start": -1, "stop": 10}, {"seed": "x", "start": 0, "stop": 501},
    {"seed": "x", "start": "0", "stop": 10}, {"seed": "", "start": 0, "stop": 1},
    {"seed": ["x"], "start": 0, "stop": 1}, {"start": 0, "stop": 1}])
def test_a_seed_task_of_unbounded_size_is_refused_and_writes_nothing(client, task_queue, payload):
    """The task route runs only what the queue delivers, but whatever it delivers is bounded: one seed task writes at
    most SEED_BATCH accounts, numbered below MAX_SEED."""
    r = client.post(tasks.ROUTE.format("accounts.seed"), json=payload,
                    headers=taskqueue.local_headers(task_queue.token, tasks.Task("accounts.seed", payload, "t", 0)))
    assert r.status_code == 422, r.get_data(as_text=True)
    assert r.get_json()["error"]["code"] in ("bad_seed", "bad_start", "bad_stop")
    assert client.get("/api/accounts/summary").get_json() == {"count": 0, "total_balance": 0}


def test_the_seed_forms_banner_is_the_apps_own(client, auth, task_queue):
    """The banner after seeding comes from the app (a flashed message), not from the URL: a link cannot put a
    visitor's text on the page."""
    assert "Seeding" not in client.get("/accounts?seeded=Your+account+is+locked.+Call+0800").get_data(as_text=True)
    auth.admin()
    r = client.post("/accounts/seed", data={"count": "12", "csrf_token": csrf_token(client, "/accounts")})
    assert r.status_code == 302 and r.headers["Location"] == "/accounts"
    html = client.get("/accounts").get_data(as_text=True)
    assert "Seeding 12 accounts in the background" in html
    assert "Seeding" not in client.get("/accounts").get_data(as_text=True)  # once


def test_seeding_needs_an_admin(client, auth, task_queue):
    assert client.post("/api/accounts/seed", json={"count": 5}).status_code == 401
    auth.sign_in()
    assert client.post("/api/accounts/seed", json={"count": 5}).status_code == 403
    assert not task_queue.queue.pending


def _audit(client, task_queue):
    job = client.post("/api/jobs", json={"name": "audit_accounts", "page_size": 40}).get_json()
    task_queue.drain(workers=3)
    assert client.get(f"/api/jobs/{job['id']}").get_json()["state"] == "done"
    audit = client.get("/api/accounts/audit").get_json()["audit"]
    assert audit["job"] == job["id"]
    return audit


def test_credit_then_summary_and_audits(client, auth, task_queue):
    auth.admin()
    assert client.get("/api/accounts/audit").get_json() == {"audit": None}
    client.post("/api/accounts/seed", json={"count": 600})
    task_queue.drain(workers=2)
    assert client.get("/api/accounts/summary").get_json() == {"count": 600, "total_balance": 0}
    job = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 7}, "page_size": 50}).get_json()
    task_queue.drain(workers=3)
    assert client.get(f"/api/jobs/{job['id']}").get_json()["state"] == "done"
    assert client.get("/api/accounts/summary").get_json() == {"count": 600, "total_balance": 4200}
    audit = _audit(client, task_queue)
    assert audit["ok"] is True and audit["found"] == audit["kept"] == {"count": 600, "total_balance": 4200}
    with runtime.current().context():
        Account(id=1, balance=5).put()  # written behind the app's back: the kept figures cannot know
    assert client.get("/api/accounts/summary").get_json() == {"count": 600, "total_balance": 4200}
    audit = _audit(client, task_queue)
    assert audit["ok"] is False
    assert audit["found"] == {"count": 601, "total_balance": 4205} and audit["kept"] == {"count": 600,
                                                                                       "total_balance": 4200}
    assert 'data-audit="mismatch"' in client.get("/accounts").get_data(as_text=True)


def test_summary_stays_exact_through_a_cancelled_job(client, auth, task_queue):
    auth.admin()
    client.post("/api/accounts/seed", json={"count": 300})
    task_queue.drain()
    job = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 3}, "page_size": 20,
                                         "fanout": 2}).get_json()
    task_queue.drain(max_deliveries=4)  # a few tasks ran, the rest are still queued
    assert client.post(f"/api/jobs/{job['id']}/cancel").status_code == 200
    task_queue.drain()  # the rest skip the cancelled job
    with runtime.current().context():
        balances = [a.balance for a in Account.query().fetch()]
    credited = sum(balances)
    assert 0 < credited < 900 and set(balances) <= {0, 3}  # part of the accounts, each once
    assert client.get("/api/accounts/summary").get_json() == {"count": 300, "total_balance": credited}
    assert _audit(client, task_queue)["ok"] is True


# --- the comment recount ------------------------------------------------------------------------------------------

def test_recount_comments_repairs_every_counter(app, client, auth, task_queue):
    with runtime.current().context():
        for title in ("a", "b", "c"):
            blog_service.post_entry("rc", title, "body", "boss@example.com")
        blog_service.post_entry("other", "x", "body", "boss@example.com")
        for index, n in ((0, 3), (1, 5)):
            for i in range(n):
                comments_service.post_comment(EntryRef("rc", index), USER, f"comment {i}")
        # break the counters: one too high, one never counted, one counting comments that do not exist
        own = comments_service.COUNTERS
        own.increment(comments_service.comments_counter(EntryRef("rc", 0)))
        for name in (comments_service.comments_counter(EntryRef("rc", 1)),
                     comments_service.comments_counter(EntryRef("rc", 2))):
            own.increment(name)
        for _ in range(4):
            own.increment(comments_service.comments_counter(EntryRef("rc", 2)))
        ndb.Key("CounterShard", own.name(comments_service.comments_counter(EntryRef("rc", 1))) + "|0").delete()
    auth.admin()
    job = client.post("/api/jobs", json={"name": "recount_comments", "params": {}}).get_json()
    task_queue.drain(workers=2)
    assert client.get(f"/api/jobs/{job['id']}").get_json()["processed"] == 4
    for index, expected in ((0, 3), (1, 5), (2, 0)):
        r = client.get(f"/api/blogs/rc/entries/{index}").get_json()
        assert r["comment_count"] == expected, (index, r["comment_count"])
    with runtime.current().context():
        assert own.exact_totals([comments_service.comments_counter(EntryRef("other", 0))]) == {"other.0": 0}


def test_recount_fits_a_chunk_of_entries_from_as_many_blogs_in_one_transaction(app, client, auth, task_queue):
    """A chunk's entries may each be in another blog (another entity group), and each repaired counter adds two groups
    (its config and a shard): the job's chunk keeps the worst case within legacy's 25 groups a transaction."""
    own = comments_service.COUNTERS
    chunk = comments_recount.RECOUNT.per_transaction
    with runtime.current().context():
        for b in range(chunk):
            blog_service.post_entry(f"rc{b:02d}", "one entry", "body", "boss@example.com")
            own.increment(comments_service.comments_counter(EntryRef(f"rc{b:02d}", 0)))  # counts a comment never made
    auth.admin()
    job = client.post("/api/jobs", json={"name": "recount_comments", "params": {}}).get_json()
    task_queue.drain(workers=2)
    done = client.get(f"/api/jobs/{job['id']}").get_json()
    assert (done["state"], done["processed"]) == ("done", chunk), done
    with runtime.current().context():
        names = [comments_service.comments_counter(EntryRef(f"rc{b:02d}", 0)) for b in range(chunk)]
        assert set(own.exact_totals(names).values()) == {0}


# --- pages ------------------------------------------------------------------------------------------------------------

def test_admin_starts_a_job_from_the_accounts_page_and_watches_it(client, auth, task_queue):
    auth.admin()
    html = client.get("/accounts").get_data(as_text=True)
    assert "Give every account credit" in html and 'for="amount"' in html
    token = csrf_token(client, "/accounts")
    r = client.post("/accounts/credit", data={"csrf_token": token, "amount": "5"})
    assert r.status_code == 302 and "/jobs/" in r.location
    page = client.get(r.location).get_data(as_text=True)
    assert "<progress" in page and 'data-field="processed"' in page and "jobs.js" in page
    listing = client.get("/jobs").get_data(as_text=True)
    assert "add_credit" in listing and "Start recount_comments" in listing


def test_jobs_page_says_when_no_job_has_run(client, auth, task_queue):
    """No job yet: a sentence, not a table of headers only; the first job brings the table."""
    html = client.get("/jobs").get_data(as_text=True)
    assert "No job has run yet. Admins start them here." in html and "<table" not in html
    auth.admin()
    client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 1}})
    html = client.get("/jobs").get_data(as_text=True)
    assert "No job has run yet" not in html and '<table class="jobs">' in html and "add_credit</a>" in html


def test_job_forms_refuse_bad_input_and_outsiders(client, auth, task_queue):
    auth.admin()
    token = csrf_token(client, "/jobs")
    r = client.post("/jobs", data={"csrf_token": token, "name": "add_credit", "amount": "-3"})
    assert r.status_code == 422 and "amount must be a whole number" in r.get_data(as_text=True)
    assert client.post("/jobs", data={"name": "add_credit", "amount": "3"}).status_code == 400  # no CSRF token
    auth.sign_in()
    token = csrf_token(client, "/jobs")
    assert client.post("/jobs", data={"csrf_token": token, "name": "add_credit", "amount": "3"}).status_code == 403
    assert "Start a job" not in client.get("/jobs").get_data(as_text=True)
    assert job_count() == 0 and not task_queue.queue.pending


# --- the local Cloud Tasks, end to end --------------------------------------------------------------------------------

@pytest.fixture
def served(stack):
    """The app served over HTTP on loopback, devstack's local Cloud Tasks delivering to it (as under `make run`)."""
    fresh = stack.fresh()
    with serving.served(lambda tasks_env: app_on(stack, **TEST_ENV, **tasks_env, **fresh)) as (app, url):
        yield app, url


def test_local_cloud_tasks_runs_a_job_to_the_end(served):
    import requests
    app, url = served
    assert isinstance(runtime.of(app).tasks.queue, tasks.CloudTasksQueue)  # the class App Engine runs
    http = requests.Session()
    assert http.post(url + "/api/session", json={"email": "boss@example.com", "admin": True}).status_code == 200
    assert http.post(url + "/api/accounts/seed", json={"count": 700}).status_code == 202
    deadline = time.monotonic() + 120
    while http.get(url + "/api/accounts/summary").json()["count"] < 700 and time.monotonic() < deadline:
        time.sleep(0.2)
    job = http.post(url + "/api/jobs", json={"name": "add_credit", "params": {"amount": 3}, "page_size": 50}).json()
    while http.get(url + f"/api/jobs/{job['id']}").json()["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    final = http.get(url + f"/api/jobs/{job['id']}").json()
    assert (final["state"], final["processed"]) == ("done", 700), final
    assert http.get(url + "/api/accounts/summary").json() == {"count": 700, "total_balance": 2100}


def test_demo_accounts_are_seeded_once(app, client):
    with runtime.current().context():
        assert accounts_demo.seed() is True
        assert accounts_demo.seed() is False  # it has accounts now
    assert client.get("/api/accounts/summary").get_json() == {"count": accounts_demo.DEMO_ACCOUNTS,
                                                              "total_balance": 0}


# --- the kept figures beside aggregation queries ----------------------------------------------------------------------

def test_aggregation_queries_beside_the_kept_figures(client, auth, task_queue, backend):
    auth.admin()
    client.post("/api/accounts/seed", json={"count": 120})
    task_queue.drain()
    client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 2}})
    task_queue.drain(workers=2)
    r = client.post("/api/accounts/aggregation")
    assert r.status_code == 200
    body = r.get_json()
    assert body["kept"]["count"] == 120 and body["kept"]["total_balance"] == 240 and body["kept"]["entity_reads"] == 34
    aggregation = body["aggregation"]
    if backend == "firestore":  # Firestore in Datastore mode has COUNT and SUM: the same figures, by reading them all
        assert aggregation == {**aggregation, "available": True, "count": 120, "total_balance": 240,
                               "index_entries": 120, "billed_reads": 1}
    else:  # the legacy emulator has no aggregation queries, and the page says so instead of failing
        assert aggregation["available"] is False and "501" in aggregation["reason"]
    html = client.post("/accounts/aggregation", data={"csrf_token": csrf_token(client, "/accounts")})
    assert html.status_code == 200 and "data-comparison" in html.get_data(as_text=True)
    # The page offers the timing only where it can be done, and says where that is otherwise.
    page = client.get("/accounts").get_data(as_text=True)
    assert ("Time both now" in page) == (backend == "firestore") != ("data-no-aggregations" in page)
    auth.sign_in()
    assert client.post("/api/accounts/aggregation").status_code == 403
    auth.sign_out()
    assert client.post("/api/accounts/aggregation").status_code == 401


# --- a job's timeline ------------------------------------------------------------------------------------------------

def _credited(client, task_queue, accounts, **job):
    """The id of a finished add_credit job over `accounts` new accounts, its tasks delivered on two threads."""
    client.post("/api/accounts/seed", json={"count": accounts})
    task_queue.drain(workers=2)
    started = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 1}, **job}).get_json()
    task_queue.drain(workers=2)
    return started["id"]


def test_a_jobs_timeline_draws_each_task_and_the_chain_it_waited_for(client, auth, task_queue):
    """Every task of a finished job is drawn, from its start to its last commit within the job's time; children start
    after their parent; the critical path runs from the root to the task that finished last."""
    auth.admin()
    job = {"id": _credited(client, task_queue, 300, page_size=20, fanout=3)}
    found = client.get(f"/api/jobs/{job['id']}/timeline").get_json()
    tasks = {t["task"]: t for t in found["tasks"]}
    assert found["job"]["state"] == "done" and found["cut"] == 0
    assert len(tasks) == found["job"]["tasks"] > 1 and sum(t["processed"] for t in tasks.values()) == 300
    for name, task in tasks.items():
        assert 0 <= task["start_s"] <= task["end_s"] <= found["job"]["elapsed"] + 1, task
        assert task["depth"] == name.count("-")
        parent = name.rsplit("-", 1)[0]
        if name != "0":
            assert tasks[parent]["start_s"] <= task["start_s"], (parent, name)
    last = max(tasks.values(), key=lambda t: t["end_s"])
    chain = {"-".join(last["task"].split("-")[:n]) for n in range(1, last["depth"] + 2)}
    assert {name for name, t in tasks.items() if t["critical"]} == chain and "0" in chain
    page = client.get(f"/jobs/{job['id']}/timeline").get_data(as_text=True)
    assert page.count("data-bar") == len(tasks) and page.count("data-critical") == len(chain)
    assert f'href="/jobs/{job["id"]}/timeline"' in client.get(f"/jobs/{job['id']}").get_data(as_text=True)


def test_a_job_over_one_account_says_one_entity(client, auth, task_queue):
    """A count of one reads as English: the timeline of a job over one account says "1 entity"."""
    auth.admin()
    job = _credited(client, task_queue, 1)
    lead = re.search(r'<p class="lead">(.*?)after', client.get(f"/jobs/{job}/timeline").get_data(as_text=True), re.S)[1]
    assert ", 1 entity, done" in lead, lead


def test_a_timeline_of_no_such_job_is_an_error(client):
    assert client.get("/api/jobs/0123456789abcdef/timeline").status_code == 404
    assert client.get("/api/jobs/nope/timeline").get_json()["error"]["code"] == "bad_job_id"
    assert client.get("/jobs/0123456789abcdef/timeline").status_code == 404


def test_a_tasks_bar_starts_when_its_delivery_began(app, client, auth, task_queue):
    """A task's start is its delivery's, before its page query and its `prepare`, not its first commit's: a job
    whose prepare takes 0.3 s draws its one task at least that long."""
    from accounts.credit import ADD_CREDIT
    from mapper import jobs

    def slow_prepare(keys, params):
        time.sleep(0.3)
    jobs.register(app, dataclasses.replace(ADD_CREDIT, name="slow_prepare", prepare=slow_prepare))
    auth.admin()
    client.post("/api/accounts/seed", json={"count": 10})
    task_queue.drain()
    job = client.post("/api/jobs", json={"name": "slow_prepare", "params": {"amount": 1}}).get_json()
    task_queue.drain()
    [task] = client.get(f"/api/jobs/{job['id']}/timeline").get_json()["tasks"]
    assert task["end_s"] - task["start_s"] >= 0.3, task


def test_a_jobs_timeline_reads_no_more_records_than_it_draws(client, auth, task_queue, monkeypatch):
    """Past MOST_TASKS the timeline draws the shallowest tasks, says how many more the job had, and reads only the
    records it draws: a public GET whose reads do not grow with the job."""
    from mapper import completion
    auth.admin()
    job = {"id": _credited(client, task_queue, 200, page_size=10, fanout=4)}
    made = client.get(f"/api/jobs/{job['id']}").get_json()["tasks"]
    monkeypatch.setattr(completion, "MOST_TASKS", 3)
    r = client.get(f"/api/jobs/{job['id']}/timeline")
    found = r.get_json()
    assert [t["task"] for t in found["tasks"]][:1] == ["0"] and len(found["tasks"]) == 3
    assert found["cut"] == made - 3 > 0 and found["most_tasks"] == 3
    assert billed(r)[0] <= 3 + 1, r.headers["Server-Timing"]  # the three records, and the job if not cached
