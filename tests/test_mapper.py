"""The mapper on the real stack: key order, split points, every entity visited exactly once, retries, completion."""
import dataclasses
import datetime
import math
import re
import threading
import time

import pytest
from google.cloud import ndb

from accounts import service as accounts_service
from accounts.credit import ADD_CREDIT, ADD_CREDIT_INCREMENTS
from accounts.models import Account
from bench.harness import billed_from_header, retried_in
from core import runtime, tasks
from mapper import completion, increments, jobs, key_arithmetic, keyrange, queueing, service, sweep, tree
from mapper.models import MapperJob
from mapper.queueing import KeptHandouts
from mapper.task import TOTAL_WEIGHT, TaskPayload, TaskRecord
from tests.support import api_commit_answers_unknown, billed, commit_answers_unknown, writers_meet_before_writing


class Thing(ndb.Model):
    _use_global_cache = False


class Branch(ndb.Model):
    _use_global_cache = False


class Statement(ndb.Model):
    """A child of an Account of another kind: a job over Account must not touch it."""
    _use_global_cache = False
    total = ndb.IntegerProperty(default=0)


def put_in_batches(entities, size=500):
    keys = []
    for i in range(0, len(entities), size):
        keys += ndb.put_multi(entities[i:i + size])
    return keys


# --- key order and split points -------------------------------------------------------------------------------------

def test_order_matches_datastore_key_order(ndb_context):
    keys = [ndb.Key(Thing, 5), ndb.Key(Thing, 2 ** 40), ndb.Key(Thing, "a"), ndb.Key(Thing, "B"), ndb.Key(Thing, "é"),
            ndb.Key(Thing, "a\u00e9"), ndb.Key(Thing, "ab"), ndb.Key(Thing, 5, Thing, 1), ndb.Key(Thing, 5, Thing, "z"),
            ndb.Key(Branch, "a", Thing, 3), ndb.Key(Branch, 7, Thing, "x"), ndb.Key(Branch, "b", Thing, 1),
            ndb.Key(Thing, "a", Thing, 9)]
    ndb.put_multi([Thing(key=k) for k in keys])
    stored = ndb.Query(kind="Thing").order(service.KEY).fetch(keys_only=True)
    assert stored == sorted(keys, key=key_arithmetic.order)
    with pytest.raises(TypeError):
        sorted(keys)  # why `order` exists


def test_arithmetic_splits_ids_evenly(ndb_context):
    lo, hi = ndb.Key(Thing, 1000), ndb.Key(Thing, 1000 + 4 * 10 ** 9)
    points = keyrange.split_points(lo, hi, 4)
    assert [p.id() for p in points] == [1000 + 10 ** 9, 1000 + 2 * 10 ** 9, 1000 + 3 * 10 ** 9]


def test_arithmetic_splits_names_inside_and_in_order(ndb_context):
    names = [f"acct-{n:05d}" for n in range(1, 1001)]
    lo, hi = ndb.Key(Thing, names[0]), ndb.Key(Thing, names[-1])
    points = keyrange.split_points(lo, hi, 4)
    assert len(points) == 3
    assert names[0] < points[0].id() < points[1].id() < points[2].id() < names[-1]
    # each of the four ranges holds a fair share of the names
    cuts = [names[0]] + [p.id() for p in points] + [names[-1] + "~"]
    shares = [sum(a < n <= b for n in names) for a, b in zip(cuts, cuts[1:], strict=False)]
    assert min(shares) >= 100, shares


@pytest.mark.parametrize("lo,hi", [
    (("Thing", 5), ("Thing", "name")),            # ids then names
    (("Thing", 5), ("Thing", 5, "Thing", 9)),     # an ancestor and its descendant
    (("Thing", "m"), ("Thing", "m", "Thing", 1000)),
    (("Branch", "a", "Thing", 3), ("Branch", "b", "Thing", 1)),
    (("Thing", 2 ** 50), ("Thing", "a")),
    (("Branch", 1), ("Thing", 1)),                 # kinds differ
])
def test_arithmetic_points_lie_strictly_between(ndb_context, lo, hi):
    lo, hi = ndb.Key(*lo), ndb.Key(*hi)
    points = keyrange.split_points(lo, hi, 4)
    assert points, "a range with room between its ends must split"
    orders = [key_arithmetic.order(k) for k in [lo] + points + [hi]]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


def test_no_room_means_no_points(ndb_context):
    assert keyrange.split_points(ndb.Key(Thing, 5), ndb.Key(Thing, 6), 4) == []
    assert keyrange.split_points(ndb.Key(Thing, "a"), ndb.Key(Thing, "a\x00"), 4) == []


def test_sample_quantiles_are_used_when_the_range_holds_enough(ndb_context):
    samples = [ndb.Key(Thing, i) for i in range(100, 200)]
    points = keyrange.split_points(ndb.Key(Thing, 1), ndb.Key(Thing, 10 ** 6), 4, samples)
    assert [p.id() for p in points] == [125, 150, 175]  # quantiles of the samples, not the middle of the ids


def test_without_samples_the_rest_of_a_range_of_ids_is_judged_by_the_pages_density(ndb_context):
    """No samples (the Firestore emulator): the page just read, 100 entities over ids (0, 1000], says the rest holds
    about 10 per 100 ids, so the rest is split about twice per page it holds, at most k ways, never k ways blindly."""
    page = (ndb.Key(Thing, 0), ndb.Key(Thing, 1000))
    assert keyrange.parts_needed(*page, ndb.Key(Thing, 1500), 100, 100, 4) == 1  # about half a page left
    assert keyrange.parts_needed(*page, ndb.Key(Thing, 2500), 100, 100, 4) == 3  # about 1.5 pages
    assert keyrange.parts_needed(*page, ndb.Key(Thing, 10 ** 6), 100, 100, 4) == 4  # many: k
    # Unknown density (a name, another parent, the root's open start): k, as before.
    assert keyrange.parts_needed(*page, ndb.Key(Thing, "a"), 100, 100, 4) == 4
    assert keyrange.parts_needed(*page, ndb.Key("Zone", 1, Thing, 1500), 100, 100, 4) == 4
    assert keyrange.parts_needed(None, page[1], ndb.Key(Thing, 1500), 100, 100, 4) == 4


def test_without_samples_a_range_ending_in_another_kind_gallops_from_its_page(ndb_context):
    """No __scatter__ samples (the Firestore emulator has none) and a far end arithmetic cannot aim at (a parent's
    children follow the names): the points go on from the page just read, spaced like it and growing fourfold, so the
    range becomes a tree instead of a chain of one page per task."""
    hi = ndb.Key("Zone", "z6", Thing, 5)  # a parent kind that sorts after Thing: its children follow every name
    page_start, page_end = ndb.Key(Thing, "acct-00000"), ndb.Key(Thing, "acct-00099")
    assert keyrange.split_points(page_end, hi, 4) == []  # arithmetic alone: no room it can see
    points = keyrange.split_points(page_end, hi, 4, (), page_start)
    # About 1, 5 and 21 pages on (the arithmetic's base is fitted to the characters, so not exactly decimal).
    assert [p.id() for p in points] == ["acct-00187", "acct-0054", "acct-01870"]
    assert "acct-00150" < points[0].id() < "acct-00250" < points[1].id() < "acct-00700" < points[2].id() < "acct-02500"
    orders = [key_arithmetic.order(k) for k in [page_end] + points + [hi]]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    ids = key_arithmetic.gallop(ndb.Key(Thing, 100), ndb.Key(Thing, 300), 4)
    assert [p.id() for p in ids] == [500, 1300, 4500]
    # an id and a name: no spacing to copy
    assert key_arithmetic.gallop(ndb.Key(Thing, 1), ndb.Key(Thing, "a"), 4) == []


# --- running jobs -----------------------------------------------------------------------------------------------------

def start(client, auth, name="add_credit", params=None, expect="running", **extra):
    auth.admin()
    r = client.post("/api/jobs", json=dict({"name": name, "params": {"amount": 10} if params is None else params},
                                           **extra))
    assert r.status_code == 202, r.get_json()
    assert r.get_json()["state"] == expect
    return r.get_json()["id"]


def job_status(client, job_id):
    r = client.get(f"/api/jobs/{job_id}")
    assert r.status_code == 200
    return r.get_json()


def watch(client, job_id, stop):
    """Poll the job's status until `stop` is set; the sequence of answers."""
    seen = []
    while not stop.is_set():
        seen.append(job_status(client, job_id))
        time.sleep(0.05)
    return seen


def test_every_account_credited_exactly_once(app, client, auth, task_queue):
    with runtime.current().context():
        scattered = put_in_batches([Account() for _ in range(5000)])
        named = put_in_batches([Account(id=f"acct-{n:05d}") for n in range(1000)])
        under_branches = put_in_batches([Account(parent=ndb.Key(Branch, f"b{n % 7}")) for n in range(70)])
        statements = put_in_batches([Statement(parent=k, total=1) for k in scattered[:40] + named[:40]])
    accounts = scattered + named + under_branches
    assert len({k.id() for k in scattered}) == 5000 and max(k.id() for k in scattered) > 2 ** 40  # scattered ids

    job_id = start(client, auth, page_size=100, fanout=4)
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=lambda: seen.extend(watch(app.test_client(), job_id, stop)))
    watcher.start()
    try:
        task_queue.drain(workers=4)
    finally:
        stop.set()
        watcher.join()
    final = job_status(client, job_id)

    with runtime.current().context():
        balances = [a.balance for a in ndb.get_multi(accounts)]
        assert balances == [10] * len(accounts)
        assert [s.total for s in ndb.get_multi(statements)] == [1] * len(statements)
    assert final["state"] == "done" and final["progress"] == 1 and final["processed"] == len(accounts)
    # a tree, not a chain: depth within ceil(log_k(N / page)) + 2 levels
    assert 1 < final["depth"] <= math.ceil(math.log(len(accounts) / 100, 4)) + 2, final
    assert final["tasks"] >= len(accounts) // 100
    # progress never went backwards, and "done" only came at the end
    progress = [s["progress"] for s in seen] + [final["progress"]]
    assert progress == sorted(progress)
    processed = [s["processed"] for s in seen]
    assert processed == sorted(processed)
    states = [s["state"] for s in seen]
    assert "done" not in states[:states.index("done")] if "done" in states else True
    assert all(s["processed"] == len(accounts) for s in seen if s["state"] == "done")


def test_a_running_jobs_view_reads_the_same_however_many_tasks_it_has(client, auth, task_queue):
    """The jobs pages poll a running job every second: its view must not read every task record (a query growing
    with the job's tasks, times its viewers). Billed reads of the list and of the job stay the same after 2 tasks
    and after 12, while the figures move on (hints from the cache), and the finished job shows the records' sums."""
    seed_accounts(600)
    job_id = start(client, auth, page_size=40, fanout=2)

    def look():
        one, listing = client.get(f"/api/jobs/{job_id}"), client.get("/api/jobs")
        return billed(one)[0], billed(listing)[0], one.get_json()

    task_queue.drain(max_deliveries=2)
    early_one, early_list, early = look()
    task_queue.drain(max_deliveries=10)
    late_one, late_list, late = look()
    assert (late_one, late_list) == (early_one, early_list) and late_one <= 2, (early_one, late_one)
    assert early["state"] == late["state"] == "running" and early["estimated"] and late["estimated"]
    assert 0 < early["processed"] < late["processed"] < 600 and early["tasks"] < late["tasks"]
    task_queue.drain(workers=2)
    final = job_status(client, job_id)
    assert (final["state"], final["processed"], final["estimated"]) == ("done", 600, False)
    assert final["tasks"] >= late["tasks"] and final["depth"] >= late["depth"] > 0
    with runtime.current().context():  # the hints as the job left them: short of its records' sums, never ahead
        hinted = completion._hinted(MapperJob.get_by_id(job_id))
    assert hinted.processed <= 600 and hinted.tasks <= final["tasks"] and 0 < hinted.depth <= final["depth"], hinted


# --- retries, duplicate deliveries, completion --------------------------------------------------------------------

FAULTS = {"fail_at": None, "failures": 0}


@pytest.fixture(autouse=True)
def _faults_disarmed():
    """A fault a test armed but that never fired (the test failed first) does not fire in a later test."""
    yield
    FAULTS.clear()
    FAULTS.update(fail_at=None, failures=0)


def _flaky_credit(accounts, params, prepared):
    """add_credit through ndb's models (a job's `apply`), except that it dies once when it reaches the account named
    in FAULTS (its task's earlier chunks have committed by then: the task dies half way through its page)."""
    _fault(accounts)
    for account in accounts:
        account.balance += params["amount"]
    return accounts


def _fault(entities):
    """Die, once, if the account named in FAULTS is among `entities` (ndb models, or mapper.bulk.ChunkEntity)."""
    if FAULTS["fail_at"] is not None and any(a.key == FAULTS["fail_at"] for a in entities):
        FAULTS["fail_at"] = None
        FAULTS["failures"] += 1
        meanwhile = FAULTS.pop("meanwhile", None)  # what another process writes while the task is down
        if meanwhile is not None:
            rt = runtime.current()
            writer = threading.Thread(target=meanwhile, args=(rt,))  # outside this chunk's transaction
            writer.start()
            writer.join(timeout=60)
            assert not writer.is_alive(), "the writer run while the task was down did not end in 60 s"
        raise RuntimeError("the task dies half way through its page")


DONE = []


class FollowUp(ndb.Model):
    """What test_flaky_credit's on_done writes: one per run that committed, under the job (an ancestor query reads
    them strongly consistent)."""


def _follow_up(job):
    """The job's on_done: may run more than once (a duplicated delivery); what it returns lands once. FAULTS'
    "follow_up_meanwhile", if set, runs once (given the job's id) on a thread of its own before it returns."""
    DONE.append(job)
    meanwhile = FAULTS.pop("follow_up_meanwhile", None)
    if meanwhile is not None:
        other = threading.Thread(target=meanwhile, args=(job.id,))
        other.start()
        other.join(timeout=60)
        assert not other.is_alive(), "the delivery run inside on_done did not end in 60 s"
    return [FollowUp(parent=ndb.Key("Job", job.id))]


def follow_ups(job_id):
    """The job ids of on_done's committed writes for `job_id`: exactly once is [job_id]."""
    with runtime.current().context():
        return [job_id for _ in FollowUp.query(ancestor=ndb.Key("Job", job_id)).fetch()]


TEST_JOBS = (dataclasses.replace(ADD_CREDIT, name="test_flaky_credit", apply=_flaky_credit,
                                 on_done=_follow_up, per_transaction_firestore=None),
             # add_credit_increments, written as protobufs (mapper/increments.py); FAULTS reach it in extra_jobs
             dataclasses.replace(ADD_CREDIT_INCREMENTS, name="test_flaky_increments", on_done=_follow_up,
                                 per_transaction_firestore=None),
             jobs.JobDefinition(name="test_always_fails", kind="Account", title="t", description="t",
                         apply=lambda *a: 1 / 0))


@pytest.fixture
def extra_jobs(app, monkeypatch):
    """The app, with the jobs above registered as a feature's init_app registers its own; FAULTS armed in an
    increments job's chunks too, as each entity's mutation is made."""
    for job in TEST_JOBS:
        jobs.register(app, job)
    incremented = increments.incremented

    def faulty(entity, deltas):
        _fault([entity])
        return incremented(entity, deltas)
    monkeypatch.setattr(increments, "incremented", faulty)
    return app


FLAKY_JOBS = ["test_flaky_credit", "test_flaky_increments"]  # the same job through ndb's models, and as protobufs


def seed_accounts(count):
    with runtime.current().context():
        return sorted(put_in_batches([Account() for _ in range(count)]), key=key_arithmetic.order)


def balances(keys):
    with runtime.current().context():
        return [a.balance for a in ndb.get_multi(keys)]


def run_out_lease(record_name):
    """As if the record's lease had run out a day ago (its delivery dead): the sweep's next run takes it up."""
    with runtime.current().context():
        record = TaskRecord.get_by_id(record_name)
        record.lease = record.lease - datetime.timedelta(days=1)
        record.put()


def swept():
    """One run of the sweep, as the scheduler makes it; what it did."""
    with runtime.current().context():
        return sweep.sweep()


@pytest.mark.parametrize("job", FLAKY_JOBS)
def test_a_task_that_dies_half_way_is_retried_without_crediting_twice(job, extra_jobs, client, auth, task_queue):
    keys = seed_accounts(300)
    FAULTS.update(fail_at=keys[50], failures=0)  # the root's page is the first 100: chunks 0-1 commit, chunk 2 dies
    job_id = start(client, auth, job, page_size=100)
    task_queue.drain()
    assert FAULTS["failures"] == 1
    root = [(status, body) for task, status, body in task_queue.responses if task.name == f"{job_id}-0"]
    assert [status for status, _ in root] == [500, 200]  # failed once, then finished from where it stopped
    with runtime.current().context():
        record = TaskRecord.get_by_id(f"{job_id}-0")
        assert record.processed == 100 and record.state == "done"
    assert balances(keys) == [10] * 300
    # the chunk that died rolled back its accounts and its record's tally: the job settled each account's credit once
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 3000
    assert job_status(client, job_id)["processed"] == 300


@pytest.mark.parametrize("job", FLAKY_JOBS)
def test_a_retry_visits_its_whole_page_though_more_entities_were_put_in_it_since(job, extra_jobs, client, auth,
                                                                                 task_queue):
    """A redelivery scans the rest of the page its first delivery fixed, up to the page's last key: 60 accounts put
    inside the page while its task was down (more than the 50 its first delivery had done) push none of the page's own
    out."""
    keys = seed_accounts(300)
    assert keys[50].id() - keys[49].id() > 61  # room for 60 ids between the 50th and 51st accounts

    def put_sixty_inside_the_page(rt):
        with rt.context():
            ndb.put_multi([Account(id=keys[49].id() + i) for i in range(1, 61)])
    FAULTS.update(fail_at=keys[50], failures=0, meanwhile=put_sixty_inside_the_page)
    job_id = start(client, auth, job, page_size=100)
    task_queue.drain()
    assert FAULTS["failures"] == 1 and job_status(client, job_id)["state"] == "done"
    assert balances(keys) == [10] * 300  # every account that was there when the job started, credited once


def test_a_finish_whose_commit_answered_unknown_but_applied_still_runs_the_jobs_follow_up(extra_jobs, client, auth,
                                                                                         task_queue, monkeypatch):
    """A commit can answer UNKNOWN and yet have applied: the retry of the transaction that finished the job finds it
    finished by this very call, and so still runs the job's on_done (the audit's result), once."""
    seed_accounts(30)
    DONE.clear()
    job_id = start(client, auth, "test_flaky_credit")
    answered = commit_answers_unknown(monkeypatch, "_end.<locals>.end")
    task_queue.drain()
    monkeypatch.undo()
    assert answered and job_status(client, job_id)["state"] == "done"
    assert follow_ups(job_id) == [job_id] and job_id in [job.id for job in DONE]


def test_a_chunk_whose_commit_answered_unknown_but_applied_goes_on_from_it(extra_jobs, client, auth, task_queue,
                                                                           monkeypatch):
    """A chunk's commit can answer UNKNOWN and yet have applied: its retry finds the record moved on by this very
    delivery's chunk (not by another delivery) and goes on with the next chunk, crediting every account once."""
    keys = seed_accounts(60)  # the root's page holds all 60: three chunks of 24 (the job's chunk)
    job_id = start(client, auth, "test_flaky_credit", page_size=100)
    answered = commit_answers_unknown(monkeypatch, "commit_chunk.<locals>.write")
    task_queue.drain()
    monkeypatch.undo()
    root = [status for task, status, _ in task_queue.responses if task.name == f"{job_id}-0"]
    assert answered and root == [200]  # not a 409 that took its own commit for another delivery's
    assert balances(keys) == [10] * 60 and job_status(client, job_id)["state"] == "done"


def test_a_start_whose_commit_answered_unknown_but_applied_starts_its_own_job(app, client, auth, task_queue,
                                                                              monkeypatch):
    """The start's retry finds the job its own commit put (the job's `call` stamp), not another request's: it
    goes on to start the job's hints and its root task, once."""
    keys = seed_accounts(30)
    answered = commit_answers_unknown(monkeypatch, "_insert.<locals>.insert")
    job_id = start(client, auth)
    monkeypatch.undo()
    hinted = runtime.cache().get_many([completion._key(job_id, "processed")])
    assert answered and hinted  # taken for another request's job, the start would have left its hints unstarted
    task_queue.drain()
    assert balances(keys) == [10] * 30 and job_status(client, job_id)["state"] == "done"


def test_a_revival_whose_commit_answered_unknown_but_applied_queues_the_task_again(app, client, auth, task_queue,
                                                                                  monkeypatch):
    """The sweep's retry of a revival finds the record revived by its own commit (`revived_by`), not renewed by a
    live delivery, and queues the task again: the job goes on now, not one lease later."""
    keys = seed_accounts(30)
    job_id = start(client, auth)
    assert task_queue.queue.take().name == f"{job_id}-0"  # the root's every delivery lost: only its record is left
    run_out_lease(f"{job_id}-0")
    answered = commit_answers_unknown(monkeypatch, "_take_up.<locals>.take_up")
    revived = swept()["revived"]
    monkeypatch.undo()
    assert answered and revived == [f"{job_id}-0"]
    task_queue.drain()
    assert balances(keys) == [10] * 30 and job_status(client, job_id)["state"] == "done"


def test_a_follow_up_whose_commit_answered_unknown_but_applied_says_it_ran(extra_jobs, client, auth, task_queue,
                                                                          monkeypatch):
    """The on_done's retry finds "ran" written by its own commit (`ran_by`): it ran, its writes landed once."""
    seed_accounts(30)
    job_id = start(client, auth, "test_flaky_credit")
    answered = commit_answers_unknown(monkeypatch, "run_follow_up.<locals>.mark_ran")
    task_queue.drain()
    monkeypatch.undo()
    ran = [body for task, _, body in task_queue.responses if task.handler == completion.DONE_HANDLER]
    assert answered and ran == [{"ran": True}] and follow_ups(job_id) == [job_id]


def test_ending_a_job_deleted_meanwhile_ends_nothing(ndb_context):
    """The job is read again in the transaction that ends it: gone since, nothing is ended (not an AttributeError)."""
    job = MapperJob(id="gone", name="add_credit", kind="Account", page_size=10, fanout=2)  # never stored
    assert completion._end(job, completion.Figures("running", returned=TOTAL_WEIGHT)) is None


def test_the_sweep_says_so_when_what_a_task_was_given_is_gone(ndb_context):
    """A task is queued again from its parent's record (and the pages it handed out): when those are gone, the sweep
    says which, rather than fail on None."""
    job = MapperJob(id="j", name="add_credit", kind="Account", page_size=10, fanout=2, kind_end=ndb.Key(Account, 9))
    assert queueing.payload_of(job, ndb.Key(TaskRecord, "j-0")) == queueing.root_payload(job)
    with pytest.raises(RuntimeError, match="parent's record is gone"):
        queueing.payload_of(job, ndb.Key(TaskRecord, "j-0-1"))
    parent = TaskRecord(id="j-0", job="j", depth=0, weight=4,
                        children=[{"job": "j", "path": "0-1", "lo": None, "hi": None, "weight": 2, "keys": None,
                                   "keys_apart": True}])
    parent.put()
    with pytest.raises(RuntimeError, match="pages it handed out are gone"):
        queueing.payload_of(job, ndb.Key(TaskRecord, "j-0-1"))


def test_accounts_ids_lie_where_the_key_arithmetic_aims(ndb_context):
    """Account ids and the mapper's key arithmetic share one ceiling (Datastore's auto ids lie below 2**53), so that
    arithmetic toward "any id" cuts the accounts' range evenly, none of it empty."""
    ids = [accounts_service.account_key("s", n).id() for n in range(200)]
    assert all(0 < i < key_arithmetic.ID_CEILING for i in ids)
    assert max(ids) > key_arithmetic.ID_CEILING // 2  # ids below 2**52 would leave the upper half of the aim empty


def test_a_split_never_hands_out_more_weight_than_it_has(ndb_context):
    """Equal shares while the weight divides; one child scanning the rest with half when it does not; a task whose
    weight is spent fails rather than leave its range unvisited with the job done."""
    job = MapperJob(id="j", name="t", kind="Account", page_size=2, fanout=2, samples=[])
    scanned = [ndb.Key(Account, i) for i in range(1, 8)]  # own page, 2 pages handed out, 1 key beyond: ranges
    payload = TaskPayload("j", "0", None, ndb.Key(Account, 99).urlsafe().decode(), 100)
    handouts, ranges = tree.split(job, payload, scanned)
    children = dataclasses.replace(payload, weight=100).make_children(handouts, ranges, after=scanned[1])
    assert [bool(c.keys) for c in children].count(True) == 2 and len(children) >= 3
    assert len({c.weight for c in children}) == 1 and sum(c.weight for c in children) < 100
    tight = dataclasses.replace(payload, weight=3).make_children(handouts, ranges, after=scanned[1])
    assert len(tight) == 1 and tight[0].keys is None and tight[0].weight == 1 and tight[0].lo_key == scanned[1]
    with pytest.raises(RuntimeError, match="weight is spent"):
        dataclasses.replace(payload, weight=1).make_children(handouts, ranges, after=scanned[1])


@pytest.mark.parametrize("job", FLAKY_JOBS)
def test_a_handed_page_that_dies_half_way_resumes_from_its_record(job, extra_jobs, client, auth, task_queue):
    """A page handed out with its keys resumes, on its next delivery, after the last key its record committed."""
    keys = seed_accounts(300)
    FAULTS.update(fail_at=keys[70], failures=0)  # in the first handed page (keys 40-79): its first chunk commits first
    job_id = start(client, auth, job, page_size=40, fanout=4)
    task_queue.drain()
    assert FAULTS["failures"] == 1
    child = [(task, status) for task, status, _ in task_queue.responses if task.name == f"{job_id}-0-0"]
    assert child[0][0].payload["keys"] and [status for _, status in child] == [500, 200]
    with runtime.current().context():
        record = TaskRecord.get_by_id(f"{job_id}-0-0")
        assert record.processed == 40 and record.state == "done"
    assert balances(keys) == [10] * 300
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 3000


@pytest.mark.parametrize("job", FLAKY_JOBS)
def test_duplicate_deliveries_at_once_credit_once_and_finish_once(job, extra_jobs, client, auth, task_queue):
    keys = seed_accounts(400)
    DONE.clear()
    job_id = start(client, auth, job, page_size=40, fanout=4)

    def twice(task):  # every task delivered twice at the same moment, as an at-least-once queue may
        results = []
        threads = [threading.Thread(target=lambda: results.append(task_queue.deliver(task))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return all(results)  # a delivery that stepped back (409) makes the queue deliver it again
    task_queue.drain(workers=4, deliver=twice)
    assert balances(keys) == [10] * 400
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 4000  # each account counted once
    assert follow_ups(job_id) == [job_id]  # the job finished, and its on_done's writes landed, exactly once
    final = job_status(client, job_id)
    assert (final["state"], final["processed"], final["progress"]) == ("done", 400, 1)
    statuses = {status for _, status, _ in task_queue.responses}
    assert statuses <= {200, 409}


def test_a_finished_task_delivered_again_and_again_returns_its_credit_once(extra_jobs, client, auth, task_queue):
    """The running sum of returned weight counts each task once, however often the queue delivers it: counted per
    delivery, one leaf's quarter of the weight delivered 14 times, then its three siblings', pass 2**64, memcached's
    incr wraps to a small number, and the real last task sees less than everything and leaves the job unfinished
    (seen in CI, where every task was delivered twice at once and each 409 brought it back)."""
    keys = seed_accounts(200)
    DONE.clear()
    job_id = start(client, auth, "test_flaky_credit", page_size=40, fanout=4)
    task_queue.drain(max_deliveries=1)  # the root: its page, then four children
    leaf = task_queue.queue.take()
    task_queue.deliver(leaf)
    for _ in range(13):  # redeliveries (delivery 1+ read the finished record)
        task_queue.deliver(leaf._replace(delivery=1))
    assert job_status(client, job_id)["state"] == "running"  # siblings still out, however often the leaf came back
    task_queue.drain()
    assert balances(keys) == [10] * 200
    assert follow_ups(job_id) == [job_id] and job_id in [job.id for job in DONE]
    assert job_status(client, job_id)["state"] == "done"


def test_concurrent_tasks_of_a_job_never_collide(app, client, auth, task_queue):
    """A job's tasks share no entity: a chunk's transaction writes its accounts and its own task's record, and the
    kept balance moves once, when the job ends (mapper/completion.py `settle`). So however many run at once, none of
    their transactions is retried after a collision: no delivery's Server-Timing has a `retried` metric. (With every
    chunk adding to one of the kept balance's shards, as the app once did, 4 workers collided here.)"""
    keys = seed_accounts(800)
    job_id = start(client, auth, page_size=40, fanout=4)
    task_queue.drain(workers=4)
    assert job_status(client, job_id)["state"] == "done" and balances(keys) == [10] * 800
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 8000
    assert len(task_queue.timings) >= 20  # many deliveries, four at a time
    assert [t for t in task_queue.timings if "retried;" in t] == []


def test_two_tasks_whose_chunks_write_at_the_same_moment_do_not_collide(app, client, auth, task_queue, monkeypatch):
    """The same, forced: two of the root's children each read their chunk, wait for the other to have read its own,
    and only then write and commit. Sharing no entity, neither commit collides: no transaction is retried. (Chunks
    of 10: room in legacy's 25 entity groups for whatever else a chunk might write.)"""
    jobs.register(app, dataclasses.replace(ADD_CREDIT_INCREMENTS, name="test_narrow_credit", per_transaction=10,
                                           per_transaction_firestore=10))
    keys = seed_accounts(400)
    job_id = start(client, auth, "test_narrow_credit", page_size=40, fanout=4)
    task_queue.drain(max_deliveries=1)  # the root: its page, then its children queued
    assert len(task_queue.queue.pending) >= 2
    # the first two chunks' commits (as protobufs: mapper/increments.py): both read before either writes
    writers_meet_before_writing(monkeypatch, at=(increments.IncrementStore, "put_multi"))
    task_queue.drain(workers=2)
    assert job_status(client, job_id)["state"] == "done" and balances(keys) == [10] * 400
    assert [t for t in task_queue.timings if "retried;" in t] == []


def test_an_increments_chunk_whose_commit_answered_unknown_but_applied_goes_on_from_it(extra_jobs, client, auth,
                                                                                        task_queue, monkeypatch):
    """The same on an increments job's chunk, a transaction of the Datastore API itself: its retry finds the record
    moved on by this very chunk, and credits nothing twice (on Firestore, where the increments are the server's, a
    second commit of them would add them again)."""
    keys = seed_accounts(60)
    job_id = start(client, auth, "test_flaky_increments", page_size=100)  # three chunks of 24
    answered = api_commit_answers_unknown(monkeypatch)
    task_queue.drain()
    monkeypatch.undo()
    root = [status for task, status, _ in task_queue.responses if task.name == f"{job_id}-0"]
    assert answered and root == [200]
    assert balances(keys) == [10] * 60 and job_status(client, job_id)["state"] == "done"
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 600
    # one transaction retried, the one whose commit answered UNKNOWN; its retry wrote nothing and ended its
    # transaction: on Firestore one left open would keep the record locked, and the next chunk's would be retried too
    assert sum(retried_in(timing) for timing in task_queue.timings) == 1


@pytest.mark.parametrize("job", [ADD_CREDIT, ADD_CREDIT_INCREMENTS], ids=["apply", "increments"])
def test_an_account_deleted_after_its_page_was_listed_is_skipped_not_made_again(app, client, auth, task_queue, job):
    """add_credit's chunk reads its accounts and skips one deleted since the page's query. add_credit_increments'
    chunk on Firestore does not read them: a server-side `update` of the deleted one fails the commit (NOT_FOUND), and
    the chunk runs again reading them, skipping it, in the same delivery (on legacy it reads them and skips it).
    Either way the account is not made again, and the tally counts the rest."""
    keys = seed_accounts(50)
    gone = keys[30]

    def delete_one(page_keys, params):  # after the page's query, before its chunks: outside their transactions
        if gone in page_keys:
            gone.delete()
    jobs.register(app, dataclasses.replace(job, name="test_deleting_credit", prepare=delete_one))
    job_id = start(client, auth, "test_deleting_credit", page_size=100)
    task_queue.drain()
    final = job_status(client, job_id)
    assert (final["state"], final["processed"]) == ("done", 49)
    # in the same delivery: not a failed one that the queue's redelivery (scanning the page again, without it) mends
    assert {status for _, status, _ in task_queue.responses} == {200}
    with runtime.current().context():
        assert gone.get() is None
    assert balances([k for k in keys if k != gone]) == [10] * 49
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 490


def test_add_credits_map_step_and_its_increments_are_one_change(app, client, auth, task_queue):
    """add_credit's map step `credit` (the talk's `balance += amount`, through ndb's models) and add_credit_increments
    (the same change as protobufs, on Firestore the server's increments) credit the same: balances, tallies, total."""
    keys = seed_accounts(60)
    plain = start(client, auth, params={"amount": 3}, page_size=25)
    task_queue.drain()
    assert balances(keys) == [3] * 60
    fast = start(client, auth, "add_credit_increments", params={"amount": 5}, page_size=25)
    task_queue.drain()
    assert balances(keys) == [8] * 60
    assert [job_status(client, job_id)["tally"] for job_id in (plain, fast)] == [{"balance": 180}, {"balance": 300}]
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 480


def test_an_increment_keeps_the_entitys_other_properties(app, client, auth, task_queue):
    """A server-side increment is an update with an empty property mask (mapper/increments.py): without the mask,
    Firestore would replace each account with its key and balance, dropping `created_by`; on legacy the account is
    read whole and written back whole."""
    with runtime.current().context():
        keys = put_in_batches([Account(balance=5, created_by=f"seed-{i}") for i in range(30)])
    job_id = start(client, auth, "add_credit_increments", page_size=100)
    task_queue.drain()
    assert job_status(client, job_id)["state"] == "done"
    with runtime.current().context():
        accounts = ndb.get_multi(keys)
    assert [(a.balance, a.created_by) for a in accounts] == [(15, f"seed-{i}") for i in range(30)]


def test_an_increments_job_on_firestore_reads_only_its_records(app, client, auth, task_queue):
    """On Firestore an increments job's chunks read the task's record alone, not its accounts: the job is billed far
    fewer reads than accounts (on legacy, about one an account: each is read in its chunk's transaction)."""
    seed_accounts(200)
    job_id = start(client, auth, "add_credit_increments", page_size=100)
    task_queue.drain()
    assert job_status(client, job_id)["state"] == "done"
    reads = sum(billed_from_header(timing).reads for timing in task_queue.timings)
    if runtime.current().settings.backend == "firestore":
        assert reads < 40, reads  # records, the job, the scan's batches: not the 200 accounts
    else:
        assert reads >= 200, reads


def test_a_job_runs_one_query_per_scan_and_a_handed_page_none(app, client, auth, task_queue):
    """A range task scans fanout + 1 pages in one query and hands the pages after its own to children that carry
    their keys: those run no query, and each visits exactly its keys. 1,000 accounts in pages of 40 with fanout 4: a
    scan covers 200 accounts, so about 5 range tasks query (and the job's start, its one query for the kind's last
    key), against 25 pages."""
    keys = seed_accounts(1000)
    job_id = start(client, auth, page_size=40, fanout=4)
    task_queue.drain()  # one worker: each response beside its own Server-Timing
    assert job_status(client, job_id)["state"] == "done" and balances(keys) == [10] * 1000
    queries = {task.name: re.search(r"(\d+) RunQuery", timing) for (task, _, _), timing in
               zip(task_queue.responses, task_queue.timings, strict=True) if task.handler == queueing.TASK_HANDLER}
    handed = {task.name: task.payload["keys"] for task, _, _ in task_queue.responses
              if task.handler == queueing.TASK_HANDLER and task.payload.get("keys")}
    assert handed and all(queries[name] is None for name in handed)  # a handed page runs no query
    ranges = [name for name in queries if name not in handed]
    assert all(queries[name] and queries[name][1] == "1" for name in ranges)  # a range task runs one
    assert len(ranges) <= 1000 // 200 + 4 and len(handed) >= 1000 // 40 - len(ranges)
    with runtime.current().context():
        for name, urlsafe in handed.items():
            record = TaskRecord.get_by_id(name)
            assert record.processed == len(urlsafe) <= 40
            assert record.last_key == ndb.Key(urlsafe=urlsafe[-1].encode())


def test_pages_handed_out_stay_within_their_byte_budget(app, client, auth, task_queue, monkeypatch):
    """A task hands out only as many scanned pages as HANDED_BYTES of keys hold (a record keeps them, a task carries
    them); the rest of its scan it splits as ranges, and still every account is credited once."""
    keys = seed_accounts(600)
    one_page = sum(len(k.urlsafe()) for k in keys[40:80])
    monkeypatch.setattr(queueing, "HANDED_BYTES", one_page + 40)  # about one page of keys, never two
    job_id = start(client, auth, page_size=40, fanout=4)
    task_queue.drain()
    assert job_status(client, job_id)["state"] == "done" and balances(keys) == [10] * 600
    with runtime.current().context():
        records = TaskRecord.query(TaskRecord.job == job_id).fetch()
        kept_pages = {r.key.id(): KeptHandouts.key_for(r.key).get() for r in records}
    for record in records:
        apart = [child for child in record.children if child["keys_apart"]]
        assert all(child["keys"] is None for child in record.children)  # the record keeps no keys
        pages = kept_pages[record.key.id()].handouts if apart else {}
        assert sorted(pages) == sorted(child["path"] for child in apart)
        assert len(apart) <= 1 and sum(len(k) for page in pages.values() for k in page) <= one_page + 40
    # a task that scanned more than it could hand out split the rest as ranges
    assert any(any(c["keys_apart"] for c in r.children) and any(not c["keys_apart"] for c in r.children)
               for r in records)


def test_a_credit_lands_on_the_kept_balance_once_when_the_job_ends(app, client, auth, task_queue):
    """The kept balance moves in the transaction that marks the job finished, by the sum of its records' tallies:
    not before (a running job's tally is in its records), and not again however often the end is reached."""
    keys = seed_accounts(120)
    job_id = start(client, auth, page_size=40, fanout=2)
    task_queue.drain(max_deliveries=1)  # the root's page credited, its children still queued
    assert sum(balances(keys)) == 40 * 10
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 0
    task_queue.drain()
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 1200
    with runtime.current().context():
        job = MapperJob.get_by_id(job_id)
        assert service.finish_job(job_id).ended == job.ended  # finished already: nothing settles twice
        for _ in range(2):
            completion.run_check({"job": job_id, "check": 1})
        # A finisher that read the job before it was marked ended (two last deliveries at once, each seeing all the
        # weight back): the end's transaction reads the job again, finds it ended, and settles nothing.
        stale = MapperJob.get_by_id(job_id)
        stale.ended = None
        assert completion._end(stale, completion._summed(stale)) is None
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 1200


@pytest.mark.parametrize("job", FLAKY_JOBS)
def test_a_delivery_repeated_after_the_first_committed_credits_nothing_again(job, extra_jobs, client, auth, task_queue):
    """An at-least-once queue may deliver a task again after its first delivery committed, as a first delivery
    (delivery 0: it does not read its record first) or as a retry. Either finds the record moved on, in the chunk's
    own transaction, and credits nothing: the order is forced here, not left to threads meeting."""
    keys = seed_accounts(60)
    DONE.clear()
    job_id = start(client, auth, job, page_size=100)  # one task: its page is every account
    root = task_queue.queue.take()
    assert task_queue.deliver(root)  # the first delivery: every chunk committed, the job finished
    task_queue.drain()  # its follow-up's task
    assert balances(keys) == [10] * 60 and follow_ups(job_id) == [job_id]
    with runtime.current().context():  # as if the job were still running: the repeats must not skip it for that
        job = MapperJob.get_by_id(job_id)
        job.ended = None
        job.put()
    assert not task_queue.deliver(root)  # delivery 0 again: its first chunk's transaction finds the record done
    assert task_queue.responses[-1][1] == 409
    assert task_queue.deliver(root._replace(delivery=1))  # a retry reads its record, finished: nothing to do
    assert balances(keys) == [10] * 60
    with runtime.current().context():
        assert TaskRecord.get_by_id(f"{job_id}-0").processed == 60


@pytest.mark.parametrize("job", FLAKY_JOBS)
def test_a_first_delivery_repeated_while_the_first_is_down_half_way_credits_nothing_again(job, extra_jobs, client, auth,
                                                                                          task_queue):
    """A repeat of a task's first delivery (delivery 0: it does not read its record first) may come while the first
    is down half way through its page: its first chunk's transaction finds the record moved past where it starts,
    steps back (409) and credits nothing; the retry goes on from the record. The order forced, not left to threads."""
    keys = seed_accounts(60)  # the root's page holds all 60: chunks of 24, the third dies
    FAULTS.update(fail_at=keys[50], failures=0)
    job_id = start(client, auth, job, page_size=100)
    root = task_queue.queue.take()
    assert not task_queue.deliver(root) and FAULTS["failures"] == 1
    assert balances(keys) == [10] * 48 + [0] * 12
    assert not task_queue.deliver(root)  # delivery 0 again: a duplicate of the first delivery
    assert task_queue.responses[-1][1] == 409 and balances(keys) == [10] * 48 + [0] * 12
    assert task_queue.deliver(root._replace(delivery=1))
    task_queue.drain()
    assert balances(keys) == [10] * 60 and job_status(client, job_id)["state"] == "done"


def test_a_follow_up_delivered_again_while_it_runs_lands_once(extra_jobs, client, auth, task_queue):
    """Two deliveries of a job's follow-up may both find it pending and both run on_done: the one that commits
    second finds "ran" in its transaction and writes nothing. Forced: the second delivery runs whole, from start to
    commit, inside the first's on_done."""
    seed_accounts(30)
    DONE.clear()
    job_id = start(client, auth, "test_flaky_credit")
    again = tasks.Task(completion.DONE_HANDLER, {"job": job_id}, f"{job_id}-done-0", 1)
    FAULTS["follow_up_meanwhile"] = lambda _: task_queue.deliver(again)
    task_queue.drain()
    ran = [body for task, _, body in task_queue.responses if task.handler == completion.DONE_HANDLER]
    assert ran == [{"ran": True}, {"ran": False}] and len(DONE) == 2  # the inner delivery committed first
    assert follow_ups(job_id) == [job_id]


@pytest.mark.parametrize("job", FLAKY_JOBS)
def test_a_task_whose_deliveries_stopped_half_way_is_taken_up_by_the_sweep_and_goes_on_from_its_record(job,
        extra_jobs, client, auth, task_queue):
    """What the sweep does for a task whose last allowed delivery was killed mid-page (tests/test_crashes.py kills
    one): no delivery of it is coming and its lease runs out; the sweep queues it again, and that delivery goes on
    from the record: every account credited once, the job done, its on_done once."""
    keys = seed_accounts(60)
    DONE.clear()
    FAULTS.update(fail_at=keys[50], failures=0)
    job_id = start(client, auth, job, page_size=100)
    assert not task_queue.deliver(task_queue.queue.take())  # down half way, and no delivery of it comes again
    assert balances(keys) == [10] * 48 + [0] * 12
    run_out_lease(f"{job_id}-0")
    assert swept()["revived"] == [f"{job_id}-0"]
    task_queue.drain()
    assert balances(keys) == [10] * 60 and job_status(client, job_id)["state"] == "done"
    assert follow_ups(job_id) == [job_id]


def test_a_job_whose_last_task_died_before_adding_its_credit_is_ended_by_the_sweep(extra_jobs, client, auth,
                                                                                  task_queue, monkeypatch):
    """A last task's delivery that died between its final commit and adding its weight to the running sum leaves a
    job no task will end: the sweep finds none of its records leased, sums them, and the job ends (its tally
    settled, its on_done run once)."""
    keys = seed_accounts(30)
    DONE.clear()
    job_id = start(client, auth, "test_flaky_credit", page_size=100)
    monkeypatch.setattr(completion, "end_if_all_back", lambda job, returned: None)  # dead before its incr
    assert task_queue.deliver(task_queue.queue.take())
    monkeypatch.undo()
    assert job_status(client, job_id)["state"] == "running" and not task_queue.queue.pending
    assert swept()["summed"] == [job_id]
    task_queue.drain()  # its on_done
    assert job_status(client, job_id)["state"] == "done" and follow_ups(job_id) == [job_id]
    assert balances(keys) == [10] * 30 and client.get("/api/accounts/summary").get_json()["total_balance"] == 300


def test_a_follow_up_never_queued_is_queued_again_by_the_sweep_and_runs_once(extra_jobs, client, auth, task_queue,
                                                                             monkeypatch):
    """A process that died between the commit that ended a job and its follow-up's enqueue leaves on_done pending
    with no task: once it is due, the sweep queues it again, and it runs once; a later sweep sends nothing more."""
    seed_accounts(30)
    DONE.clear()
    job_id = start(client, auth, "test_flaky_credit")
    monkeypatch.setattr(completion, "send_follow_up", lambda job: None)  # dead before its enqueue
    task_queue.drain()
    monkeypatch.undo()
    assert job_status(client, job_id)["state"] == "done" and follow_ups(job_id) == [] and not DONE
    with runtime.current().context():
        job = MapperJob.get_by_id(job_id)
        job.follow_up_due = job.follow_up_due - datetime.timedelta(days=1)  # its due time has passed
        job.put()
    assert swept()["follow_ups"] == [job_id]
    task_queue.drain()
    assert follow_ups(job_id) == [job_id] and len(DONE) == 1
    assert swept()["follow_ups"] == []


def test_a_task_that_keeps_failing_fails_the_job(extra_jobs, client, auth, task_queue):
    seed_accounts(30)
    job_id = start(client, auth, "test_always_fails", params={})
    task_queue.drain()
    deliveries = [status for task, status, _ in task_queue.responses if task.name == f"{job_id}-0"]
    assert deliveries == [500] * 9 + [200]  # the queue's last attempt records the failure and ends the task
    final = job_status(client, job_id)
    assert final["state"] == "failed" and final["processed"] == 0
    assert balances([]) == []


def test_arithmetic_alone_still_splits_into_a_shallow_tree(app, client, auth, task_queue, monkeypatch):
    monkeypatch.setattr(service, "SAMPLES", 0)  # as on a kind too new to have __scatter__ samples
    keys = seed_accounts(1500)
    job_id = start(client, auth, page_size=50, fanout=4)
    with runtime.current().context():
        assert MapperJob.get_by_id(job_id).samples == []
    task_queue.drain(workers=2)
    final = job_status(client, job_id)
    assert balances(keys) == [10] * 1500
    assert final["depth"] <= math.ceil(math.log(1500 / 50, 4)) + 2, final


def test_a_job_over_an_empty_kind_is_done_at_once(app, client, auth, task_queue):
    job_id = start(client, auth, expect="done")
    assert not task_queue.queue.pending
    final = job_status(client, job_id)
    assert (final["state"], final["progress"], final["processed"], final["tasks"]) == ("done", 1, 0, 0)


def test_cancel_stops_the_tasks_not_yet_run(app, client, auth, task_queue):
    keys = seed_accounts(200)
    job_id = start(client, auth, page_size=20)
    task_queue.drain(max_deliveries=1)  # the root only
    r = client.post(f"/api/jobs/{job_id}/cancel")
    assert r.status_code == 200 and r.get_json()["state"] == "cancelled"
    task_queue.drain()
    assert sum(balances(keys)) == 20 * 10  # only the root's page
    final = job_status(client, job_id)
    # the tasks not yet run handed their ranges back unvisited, so the job ended, settling what it did
    assert final["state"] == "cancelled" and final["progress"] == 1 and final["processed"] == 20
    assert client.get("/api/accounts/summary").get_json()["total_balance"] == 200


def test_cancelling_a_job_that_ended_cancelled_is_answered_as_done(app, client, auth, task_queue):
    """A cancel sent again (or retried after its commit answered UNKNOWN) once the job has ended cancelled is not a
    conflict: what it asked for is done."""
    seed_accounts(100)
    job_id = start(client, auth, page_size=20, fanout=2)
    assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 200
    task_queue.drain()
    assert job_status(client, job_id)["state"] == "cancelled"
    again = client.post(f"/api/jobs/{job_id}/cancel")
    assert again.status_code == 200 and again.get_json()["state"] == "cancelled"


def test_cancelling_a_finished_job_is_a_conflict(app, client, auth, task_queue):
    job_id = start(client, auth, expect="done")
    r = client.post(f"/api/jobs/{job_id}/cancel")
    assert r.status_code == 409 and r.get_json()["error"]["code"] == "job_finished"
