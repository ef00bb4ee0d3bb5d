"""Nothing acknowledged is lost when a process dies: the app served by gunicorn (two workers), its tasks in devstack's
local Cloud Tasks (outside the app's processes, as on App Engine), and real faults: a worker SIGKILLed in the middle of
writes and of a mapper job, the emulator frozen, the cache restarted or frozen while a job runs. Each test checks its
invariant from the stored data, not from the answers alone, and is bounded in time.
"""
import concurrent.futures
import contextlib
import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml
from google.cloud import ndb

from accounts.models import Account
from blog.models import BlogEntry, BlogIndex
from core import runtime
from counters import totals as counters
from devstack.services import REPO
from devstack.serving import queued, signed_in, wait_until
from mapper import completion
from mapper.models import MapperJob
from mapper.task import TOTAL_WEIGHT, TaskRecord
from tests.support import WRITE_BUDGET, at_once, make_app, running

ADMIN = "boss@example.com"
SECRET = "crashes-test-secret"
ACCOUNTS = 150
DIE_AFTER_COMMIT = "die-after-commit-"  # tests/crashapp.py kills the worker of the first write of such a name


class Fleet:
    def __init__(self, url, server, app, stack, signals):
        self.url, self.server, self.app, self.stack, self.signals = url, server, app, stack, signals

    def read(self, fn):
        return runtime.of(self.app).in_context(fn)()

    def workers(self):
        pid = self.server.proc.pid
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}

    def kill_workers(self, count):
        """SIGKILL `count` of gunicorn's workers (its master starts new ones); their pids."""
        killed = sorted(self.workers())[:count]
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        return killed

    def admin(self):
        return signed_in(self.url, ADMIN, admin=True)


@contextlib.contextmanager
def _fleet(stack, tmp_path_factory, seed, queue_yaml=None, **env):
    namespace = f"c{uuid.uuid4().hex[:12]}"  # the server outlives any one test: a namespace of its own
    signals = tmp_path_factory.mktemp("crash-signals")
    with queued(stack, SECRET, admins=ADMIN, app="tests.crashapp:app()", queue_yaml=queue_yaml,
                DATASTORE_NAMESPACE=namespace, CRASH_SIGNALS=str(signals), WRITE_BUDGET=WRITE_BUDGET, **env) as server:
        app = make_app(stack, checked=False, DATASTORE_NAMESPACE=namespace, SECRET_KEY=SECRET)
        with running(app):
            fleet = Fleet(server.url, server, app, stack, signals)
            seed(fleet)
            yield fleet


@pytest.fixture(scope="module")
def fleet(stack, tmp_path_factory):
    with _fleet(stack, tmp_path_factory, _seed_accounts) as fleet:
        yield fleet


LEASE, SWEEP = 3, 1  # seconds: a test waits for the sweep seconds, not the defaults' minutes


@pytest.fixture(scope="module")
def last_delivery(stack, tmp_path_factory):
    """A fleet whose queue delivers each task once (task_retry_limit: 1): every delivery is its task's last allowed
    one, so only the sweep (every SWEEP s, leases of LEASE s) can take up a task whose process died."""
    queues = yaml.safe_load((REPO / "queue.yaml").read_text())
    for queue in queues["queue"]:
        queue["retry_parameters"]["task_retry_limit"] = 1
    queue_yaml = tmp_path_factory.mktemp("queues") / "queue.yaml"
    queue_yaml.write_text(yaml.safe_dump(queues))

    def seed(fleet):  # from here: the seed's own tasks would get one delivery too
        fleet.read(lambda: ndb.put_multi([Account(balance=0) for _ in range(ACCOUNTS)]))
    with _fleet(stack, tmp_path_factory, seed, queue_yaml=queue_yaml, MAPPER_LEASE_SECONDS=str(LEASE),
                MAPPER_SWEEP_SECONDS=str(SWEEP)) as fleet:
        yield fleet


def _seed_accounts(fleet):
    admin = fleet.admin()
    assert admin.post(f"{fleet.url}/api/accounts/seed", json={"count": ACCOUNTS}, timeout=30).status_code == 202
    wait_until(lambda: len(fleet.read(lambda: Account.query().fetch(keys_only=True))) == ACCOUNTS,
               "the accounts seeded by tasks", timeout=120)


def _until_acknowledged(session, method, url, key, attempts=60, **kwargs):
    """A client that retries with its Idempotency-Key until the app acknowledges (2xx): the statuses it saw."""
    seen = []
    for _ in range(attempts):
        try:
            r = session.request(method, url, headers={"Idempotency-Key": key}, timeout=60, **kwargs)
            seen.append(r.status_code)
            if 200 <= r.status_code < 300:
                return seen, r
        except requests.RequestException as e:
            seen.append(type(e).__name__)
        time.sleep(0.2)
    raise AssertionError(f"{method} {url} with key {key} never acknowledged: {seen}")


def _burst(count, fn, during):
    """fn(i) for i in range(count) on 8 threads; `during()` runs once a third of them have answered."""
    answered, fired = [0], threading.Event()
    lock = threading.Lock()

    def one(i):
        result = fn(i)
        with lock:
            answered[0] += 1
            if answered[0] == count // 3:
                fired.set()
        return result
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(count)]
        assert fired.wait(120), "the burst did not get a third of the way"
        during()
        return [f.result() for f in futures]


def _balances(fleet):
    return fleet.read(lambda: {a.key: a.balance for a in Account.query()})


def _run_job(fleet, name, amount, killing=None, **extra):
    """Start job `name` (amount each), call killing(job_id) while it runs, wait until it ends: its final JSON."""
    admin = fleet.admin()
    r = admin.post(f"{fleet.url}/api/jobs", json={"name": name, "params": {"amount": amount}, **extra}, timeout=30)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    if killing:
        killing(job_id)
    _wait_finished(fleet, job_id)
    # A fresh session: the first one's kept-alive connection may be to a worker killed meanwhile (a reset).
    return fleet.admin().get(f"{fleet.url}/api/jobs/{job_id}", timeout=30).json()


def _wait_finished(fleet, job_id):
    wait_until(lambda: fleet.read(lambda: MapperJob.get_by_id(job_id, use_cache=False,
                                                                use_global_cache=False).ended),
               f"job {job_id} to finish", timeout=180, interval=0.5)


def _records(fleet, job_id):
    return fleet.read(lambda: TaskRecord.query(TaskRecord.job == job_id).fetch())


def _credited_once(before, after, amount):
    assert set(after) == set(before) and len(after) == ACCOUNTS
    wrong = {k: (before[k], after[k]) for k in after if after[k] != before[k] + amount}
    shown = [(k.flat(), v) for k, v in wrong.items()][:5]  # flat(): a Key's repr needs an ndb context
    assert not wrong, f"{len(wrong)} accounts not credited exactly once: {shown}"


# --- a worker killed -------------------------------------------------------------------------------------------------

def test_increments_with_keys_count_once_when_a_worker_is_killed(fleet):
    name = f"crash-{uuid.uuid4().hex[:8]}"
    sessions = [fleet.admin() for _ in range(8)]
    assert sessions[0].put(f"{fleet.url}/api/counters/{name}", json={"mode": "general"}, timeout=30).status_code \
        in (200, 201)
    before = fleet.workers()
    killed = []
    results = _burst(80, lambda i: _until_acknowledged(sessions[i % 8], "POST",
                                                       f"{fleet.url}/api/counters/{name}/increment", f"inc-{i}"),
                     during=lambda: killed.extend(fleet.kill_workers(1)))
    assert killed and killed[0] in before
    wait_until(lambda: len(fleet.workers() - set(killed)) == 2, "gunicorn to replace the killed worker")
    assert len(results) == 80  # every increment acknowledged, some after retries
    assert fleet.read(lambda: counters.exact_totals([name])[name]) == 80  # and each counted once, in the shards


def test_posts_with_keys_stay_dense_and_single_when_a_worker_is_killed(fleet):
    blog = f"crash-{uuid.uuid4().hex[:8]}"
    sessions = [fleet.admin() for _ in range(8)]
    killed = []
    results = _burst(24, lambda i: _until_acknowledged(sessions[i % 8], "POST", f"{fleet.url}/api/blogs/{blog}/entries",
                                                       f"post-{i}", json={"title": f"post {i}", "body": "b"}),
                     during=lambda: killed.extend(fleet.kill_workers(1)))
    assert killed
    entries = fleet.read(lambda: BlogEntry.query(ancestor=ndb.Key(BlogIndex, blog)).fetch())
    assert sorted(e.index for e in entries) == list(range(24))  # dense: no gap, no index twice
    assert sorted(e.title for e in entries) == sorted(f"post {i}" for i in range(24))  # each post once
    assert sorted(r.json()["index"] for _, r in results) == list(range(24))  # each answer names its own entry


def _sent_again_after_its_worker_died(fleet, path, key, **kwargs):
    """POST `path` with Idempotency-Key `key` until acknowledged, its first send's worker killed between the write's
    commit and its answer (tests/crashapp.py, DIE_AFTER_COMMIT): the answer, once the worker is seen to have died."""
    seen, answer = _until_acknowledged(fleet.admin(), "POST", f"{fleet.url}{path}", key, **kwargs)
    assert seen[0] == "ConnectionError" and len(seen) > 1, seen  # the first answer lost with its worker
    return answer


def test_an_increment_whose_worker_dies_after_its_commit_counts_once_when_sent_again_with_its_key(fleet):
    """Every time, not by luck: the first send commits, its worker dies before answering, the client sends it again
    with its key, and the marker written in that commit makes the second send count nothing."""
    name = f"{DIE_AFTER_COMMIT}{uuid.uuid4().hex[:8]}"
    assert fleet.admin().put(f"{fleet.url}/api/counters/{name}", json={"mode": "general"}, timeout=30).status_code \
        in (200, 201)
    _sent_again_after_its_worker_died(fleet, f"/api/counters/{name}/increment", "once")
    assert (fleet.signals / f"{name}.died").exists()
    assert fleet.read(lambda: counters.exact_totals([name])[name]) == 1


def test_a_post_whose_worker_dies_after_its_commit_is_posted_once_when_sent_again_with_its_key(fleet):
    """As the increment above: the post's first send commits and its worker dies before answering; the send again
    with its key answers with that entry, and the blog holds one."""
    blog = f"{DIE_AFTER_COMMIT}{uuid.uuid4().hex[:8]}"
    answer = _sent_again_after_its_worker_died(fleet, f"/api/blogs/{blog}/entries", "once",
                                               json={"title": "once", "body": "b"})
    assert (fleet.signals / f"{blog}.died").exists()
    entries = fleet.read(lambda: BlogEntry.query(ancestor=ndb.Key(BlogIndex, blog)).fetch())
    assert [(e.index, e.title) for e in entries] == [(0, "once")] and answer.json()["index"] == 0


def test_a_job_finishes_and_credits_each_account_once_when_a_worker_is_killed(fleet):
    before = _balances(fleet)
    final = _run_job(fleet, "add_credit_increments", 7, killing=lambda _: (time.sleep(0.3), fleet.kill_workers(1)),
                     page_size=10)
    assert (final["state"], final["processed"]) == ("done", ACCOUNTS), final
    _credited_once(before, _balances(fleet), 7)


def _kill_root_mid_page(fleet, job_id, cut):
    """The root task's page is 50 accounts in chunks of 5, a quarter second each: once its record shows a chunk
    committed and the page not finished, every worker is killed, the one running it among them (kept in `cut`)."""
    def half_way():
        record = fleet.read(lambda: TaskRecord.get_by_id(f"{job_id}-0"))
        return record if record and record.state == "running" and 0 < record.processed < 50 else None
    cut["record"] = wait_until(half_way, "the root task's first chunk", timeout=60, interval=0.05)
    fleet.kill_workers(2)


def _job_killed_mid_root_page(fleet):
    """A job of 3 each whose root task's workers are killed half way through its page (_kill_root_mid_page): the job
    ended done, every account credited once; (its final JSON, the root's record, the record as the kill cut it)."""
    before, cut = _balances(fleet), {}
    final = _run_job(fleet, "test_slow_credit", 3, killing=lambda job_id: _kill_root_mid_page(fleet, job_id, cut),
                     page_size=50)
    assert (final["state"], final["processed"]) == ("done", ACCOUNTS), final
    _credited_once(before, _balances(fleet), 3)
    return final, fleet.read(lambda: TaskRecord.get_by_id(f"{final['id']}-0")), cut["record"]


def test_a_delivery_killed_after_its_first_chunk_resumes_from_its_record(fleet):
    final, root, cut = _job_killed_mid_root_page(fleet)
    # the redelivery went on from the record: the page processed once in all, past where the kill cut it
    assert root.state == "done" and root.processed == 50 and cut.processed < 50


# --- the emulator frozen ---------------------------------------------------------------------------------------------

def test_writes_while_the_emulator_is_frozen_are_lost_never_once_acknowledged(fleet):
    name = f"frozen-{uuid.uuid4().hex[:8]}"
    sessions = [fleet.admin() for _ in range(8)]
    assert sessions[0].put(f"{fleet.url}/api/counters/{name}", json={"mode": "general"}, timeout=30).status_code \
        in (200, 201)
    emulator = fleet.stack.emulator

    def freeze():
        emulator.pause()
        time.sleep(3)
        emulator.resume()
    try:
        results = _burst(40, lambda i: _until_acknowledged(sessions[i % 8], "POST",
                                                           f"{fleet.url}/api/counters/{name}/increment", f"f-{i}"),
                         during=freeze)
    finally:
        emulator.resume()
    assert len(results) == 40
    # the freeze caught writes in flight: they waited for it (no Datastore call here has a deadline) and then landed
    assert max(r.elapsed.total_seconds() for _, r in results) >= 2.0
    assert fleet.read(lambda: counters.exact_totals([name])[name]) == 40
    # service resumed: a new write is acknowledged at once
    assert sessions[0].post(f"{fleet.url}/api/counters/{name}/increment", timeout=30).status_code == 200


# --- the cache lost or frozen while a job runs --------------------------------------------------------------------

def test_a_job_finishes_exactly_when_the_cache_restarts_in_its_middle(fleet):
    before = _balances(fleet)

    def restart_cache(job_id):
        wait_until(lambda: any(r.state == "done" for r in _records(fleet, job_id)), "a first task done", timeout=60,
                   interval=0.1)
        fleet.stack.cache.restart()  # empty: the running sum of returned credit is gone with everything else
    final = _run_job(fleet, "test_slow_credit", 5, killing=restart_cache, page_size=20)
    assert (final["state"], final["processed"]) == ("done", ACCOUNTS), final
    _credited_once(before, _balances(fleet), 5)


def test_a_job_finishes_exactly_when_the_cache_is_frozen_in_its_middle(fleet):
    """A frozen cache delays: every call times out (0.25 s) and counts as a miss; the job's checks sum the records."""
    before = _balances(fleet)

    def freeze_a_while(job_id):
        wait_until(lambda: any(r.state == "done" for r in _records(fleet, job_id)), "a first task done", timeout=60,
                   interval=0.1)
        fleet.stack.cache.pause()
        try:
            time.sleep(3)
        finally:
            fleet.stack.cache.resume()
    final = _run_job(fleet, "test_slow_credit", 2, killing=freeze_a_while, page_size=20)
    assert (final["state"], final["processed"]) == ("done", ACCOUNTS), final
    _credited_once(before, _balances(fleet), 2)


def _kill_between_commit_and_incr(fleet, job_id):
    """tests/crashapp.py holds a task a second between its record's last commit and its incr, and names the worker
    holding it by a file; that worker is killed inside the second (the file is polled, not the emulator)."""
    held = wait_until(lambda: sorted(fleet.signals.glob(f"{job_id}.*")), "a task between its commit and its incr",
                      timeout=60, interval=0.01)
    os.kill(int(held[0].suffix[1:]), signal.SIGKILL)


def _running_sum_is_short(fleet, job_id):
    """The kill did land in the gap: the job's running sum in the cache is short of the whole (read again if the first
    get fails: this process's pooled connection may predate an earlier test's restart)."""
    running_sum = wait_until(lambda: fleet.read(
        lambda: runtime.of(fleet.app).cache.get(f"mapper-returned:{job_id}")), "the running sum", 10)
    assert int(running_sum) < TOTAL_WEIGHT, running_sum


def test_a_job_finishes_when_a_worker_dies_between_a_task_commit_and_its_incr(fleet):
    """The running sum loses a task's credit for good (the delivery that finished the record died before adding it);
    its redelivery finds the record final, trusts the records over the sum, and checks finish the job."""
    before = _balances(fleet)
    final = _run_job(fleet, "test_slow_credit", 4, killing=lambda job_id: _kill_between_commit_and_incr(fleet, job_id),
                     page_size=20)
    assert (final["state"], final["processed"]) == ("done", ACCOUNTS), final
    _credited_once(before, _balances(fleet), 4)
    _running_sum_is_short(fleet, final["id"])


# --- the sweep: a task whose last allowed delivery died, a job's follow-up whose process died ------------------------

def _follow_ups(fleet, job_id):
    """The committed runs of test_slow_credit's on_done for the job (tests/crashapp.py), read strongly consistent."""
    return fleet.read(lambda: len(ndb.Query(kind="CrashFollowUp", ancestor=ndb.Key("Job", job_id))
                                  .fetch(keys_only=True)))


def test_a_task_killed_in_its_last_allowed_delivery_is_taken_up_again_by_the_sweep(last_delivery):
    fleet = last_delivery
    final, root, cut = _job_killed_mid_root_page(fleet)
    # the queue had no delivery left: the sweep queued it again, and it went on from its record
    assert root.state == "done" and root.processed == 50 and root.revived >= 1
    assert cut.processed < 50 and final["revived"] >= 1
    wait_until(lambda: _follow_ups(fleet, final["id"]) == 1, "the job's on_done", timeout=30)
    page = fleet.admin().get(f"{fleet.url}/jobs/{final['id']}/timeline", timeout=30)
    assert page.status_code == 200 and "0 (swept)" in page.text and "taken up again by the sweep" in page.text
    timeline = fleet.admin().get(f"{fleet.url}/api/jobs/{final['id']}/timeline", timeout=30).json()
    assert [t["revived"] for t in timeline["tasks"] if t["task"] == "0"] == [root.revived]
    time.sleep(LEASE + 2 * SWEEP)  # later sweeps leave the finished job alone: on_done still ran once
    assert _follow_ups(fleet, final["id"]) == 1
    # and every record is off the sweep's list: the running ones ended, the ended ones' children checked
    records = fleet.read(lambda: completion.records(MapperJob.get_by_id(final["id"])))  # by key: strongly consistent
    assert len(records) == final["tasks"] and [r.key.id() for r in records if r.lease is not None] == []


def test_a_last_delivery_killed_between_its_commit_and_its_incr_leaves_the_jobs_end_to_the_sweep(last_delivery):
    """On its task's last allowed delivery, a process dies between the record's final commit and adding its credit to
    the running sum: no delivery comes back to sum the records, and the sum stays short for good. The sweep, finding
    no task of the job at work, sums the records and the job finishes."""
    fleet = last_delivery
    before = _balances(fleet)
    final = _run_job(fleet, "test_slow_credit", 5, killing=lambda job_id: _kill_between_commit_and_incr(fleet, job_id),
                     page_size=20)
    assert (final["state"], final["processed"]) == ("done", ACCOUNTS), final
    _credited_once(before, _balances(fleet), 5)
    _running_sum_is_short(fleet, final["id"])
    wait_until(lambda: _follow_ups(fleet, final["id"]) == 1, "the job's on_done", timeout=30)


def test_a_process_killed_between_a_jobs_end_and_its_on_done_leaves_it_to_the_sweep(last_delivery):
    fleet = last_delivery
    before = _balances(fleet)
    cut = {}

    def kill_after_the_end(job_id):
        # tests/crashapp.py holds the finisher two seconds between the finishing commit and the follow-up's enqueue,
        # and names its process by a file: that process is killed there
        held = wait_until(lambda: sorted(fleet.signals.glob(f"follow-{job_id}.*")), "the job's finishing commit",
                          timeout=120, interval=0.01)
        cut["pid"] = int(held[0].suffix[1:])
        os.kill(cut["pid"], signal.SIGKILL)
    final = _run_job(fleet, "test_slow_credit", 6, killing=kill_after_the_end, page_size=20)
    assert (final["state"], final["processed"]) == ("done", ACCOUNTS), final
    _credited_once(before, _balances(fleet), 6)
    job = wait_until(lambda: fleet.read(lambda: (lambda j: j if j.follow_up == "ran" else None)(
        MapperJob.get_by_id(final["id"], use_cache=False, use_global_cache=False))), "the on_done", timeout=60)
    assert job.follow_up_sent >= 1  # sent by the sweep: the finisher died before sending it
    time.sleep(LEASE + 2 * SWEEP)
    assert _follow_ups(fleet, final["id"]) == 1  # ran exactly once


# --- a job start sent twice ------------------------------------------------------------------------------------------

def test_a_job_start_sent_again_at_once_to_other_processes_starts_one_job(last_delivery):
    """The same start sent four times at once, each on a connection of its own (gunicorn's two workers share them),
    by the API with one Idempotency-Key and by the credit form with one token: one job each, every account credited
    once by each."""
    fleet = last_delivery
    before = _balances(fleet)
    key = f"start-{uuid.uuid4().hex}"
    sessions = [fleet.admin() for _ in range(4)]
    answers = [r for r, _ in at_once(4, lambda i: sessions[i].post(
        f"{fleet.url}/api/jobs", json={"name": "test_slow_credit", "params": {"amount": 2}, "page_size": 50},
        headers={"Idempotency-Key": key}, timeout=60))]
    assert [r.status_code for r in answers] == [202] * 4, [r.text for r in answers]
    assert len({r.json()["id"] for r in answers}) == 1
    # The first job ends before the form's starts: two jobs crediting the same accounts at once, on Firestore's
    # locks with one delivery per task, can fail their tasks by contention alone (seen here: both ended "failed"),
    # which is not what this test is about.
    _wait_finished(fleet, answers[0].json()["id"])
    html = sessions[0].get(f"{fleet.url}/accounts", timeout=30).text
    form = re.search(r'action="/accounts/credit".*?name="csrf_token" value="([^"]+)".*?'
                     r'name="start_token" value="([^"]+)"', html, re.S)
    data = {"amount": "5", "csrf_token": form.group(1), "start_token": form.group(2)}
    copies = [requests.Session() for _ in range(4)]
    for copy in copies:
        copy.cookies.update(sessions[0].cookies)
    sent = [r for r, _ in at_once(4, lambda i: copies[i].post(f"{fleet.url}/accounts/credit", data=data,
                                                               allow_redirects=False, timeout=60))]
    assert [r.status_code for r in sent] == [302] * 4 and len({r.headers["Location"] for r in sent}) == 1
    ids = (answers[0].json()["id"], sent[0].headers["Location"].rsplit("/", 1)[1])
    _wait_finished(fleet, ids[1])
    finals = [fleet.admin().get(f"{fleet.url}/api/jobs/{job_id}", timeout=30).json() for job_id in ids]
    assert [f["state"] for f in finals] == ["done", "done"], finals
    _credited_once(before, _balances(fleet), 2 + 5)
