"""The mapper's termination credit on the real stack (weight-throwing, mapper/task.py): a task that ends early after it
split returns only the share it kept, and a job's end reads its records once, not once per task end."""
import dataclasses

import pytest

from accounts.credit import ADD_CREDIT
from bench.harness import billed_from_header
from core import costs, runtime, tasks
from mapper import completion, jobs
from mapper.models import MapperJob
from mapper.task import TOTAL_WEIGHT, TaskRecord
from tests.test_mapper import balances, job_status, run_out_lease, seed_accounts, start, swept

DIES_AT = set()  # the keys of the accounts whose chunk always dies (test_dies_at's apply)


def _credit_dying_at(accounts, params, prepared):
    """add_credit through ndb's models, except that a chunk holding an account in DIES_AT dies, on every delivery."""
    if any(account.key in DIES_AT for account in accounts):
        raise RuntimeError("this chunk dies on every delivery")
    for account in accounts:
        account.balance += params["amount"]
    return accounts


DIES_AT_JOB = dataclasses.replace(ADD_CREDIT, name="test_dies_at", apply=_credit_dying_at,
                                  per_transaction_firestore=None)


def _records(job_id):
    with runtime.current().context():
        job = MapperJob.get_by_id(job_id)
        return completion.records(job), completion._hinted(job).returned


@pytest.mark.parametrize("root_first", [True, False], ids=["root_first", "children_first"])
@pytest.mark.parametrize("end", ["cancelled", "failed"])
def test_a_task_that_ends_early_after_it_split_hands_back_only_the_share_it_kept(end, root_first, app, client, auth,
                                                                                task_queue):
    """The root splits (its first chunk records its children and queues them), then dies half way through its page;
    it then ends early, cancelled or failed for good (its last allowed delivery dies too), before or after its
    children ended. Its children return their own shares: the root returns only what it kept. Were it to return
    its whole credit, the returned credit would pass the whole (the job never ends) or reach it while children are
    still out (the job ends with ranges unvisited)."""
    DIES_AT.clear()
    jobs.register(app, DIES_AT_JOB)
    keys = seed_accounts(300)
    DIES_AT.add(keys[50])  # in the root's page of 100: its first chunks commit, the one holding keys[50] dies
    job_id = start(client, auth, "test_dies_at", page_size=100, fanout=2)
    root = task_queue.queue.take()
    assert not task_queue.deliver(root)
    with runtime.current().context():
        split = TaskRecord.get_by_id(f"{job_id}-0")
    assert split.state == "running" and split.children and 0 < split.processed < 100
    assert 0 < split.own_share < split.weight == TOTAL_WEIGHT
    if end == "cancelled":
        assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 200
    early_end = root._replace(delivery=1 if end == "cancelled" else tasks.MAX_DELIVERIES - 1)
    if root_first:
        assert task_queue.deliver(early_end)
    task_queue.drain()  # the children (and, once every credit is back, nothing more)
    if not root_first:
        assert task_queue.deliver(early_end)
        task_queue.drain()
    final = job_status(client, job_id)
    assert (final["state"], final["progress"]) == (end, 1), final
    records, hinted = _records(job_id)
    assert {f"{job_id}-{child['path']}" for child in split.children} <= {r.key.id() for r in records}
    assert all(r.state != "running" for r in records)
    assert sum(r.returned for r in records) == TOTAL_WEIGHT  # the whole, not more
    assert hinted == TOTAL_WEIGHT  # the running sum the tasks added to, likewise
    root_record = next(r for r in records if r.key.id() == f"{job_id}-0")
    assert root_record.state == ("done" if end == "cancelled" else "failed")
    assert root_record.returned == root_record.own_share == split.own_share
    credited = sum(b == 10 for b in balances(keys))
    if end == "cancelled":  # only the root's chunks that committed before it died
        assert credited == final["processed"] == split.processed
    else:  # the children visited the rest of the range
        assert credited == final["processed"] == 300 - 100 + split.processed


def test_a_task_returns_its_share_only_once_it_has_ended(ndb_context):
    """A task's record returns no weight while it runs, and its own share once it has ended (done, or failed): a job's
    check sums the records' `returned`, so a running task's share counted there would end the job with its page
    undone. As stored and read back, too."""
    from google.cloud import ndb
    record = TaskRecord(key=ndb.Key(TaskRecord, "j-0"), job="j", depth=0, weight=TOTAL_WEIGHT,
                        children=[{"weight": TOTAL_WEIGHT // 4}])
    record.put()
    assert (record.returned, record.key.get(use_cache=False).returned) == (0, 0)
    for state in ("done", "failed"):
        record.state = state
        record.put()
        assert record.returned == record.key.get(use_cache=False).returned == TOTAL_WEIGHT - TOTAL_WEIGHT // 4


def test_a_task_end_reads_no_more_records_as_its_job_grows_though_the_cache_lost_the_running_sum(app, client, auth,
                                                                                                 task_queue):
    """Once the cache lost a job's running sum (restarted, flushed), a task end has no sum to add its credit to; and a
    task delivered again after its record ended has no credit to add. Neither may read every record of the job to see
    whether it is done (each of the job's later task ends doing so: quadratic in its tasks): check tasks do, one read
    of them a check. Counted here: what a task's end costs in Datastore reads after the cache was flushed, early in a
    job and once it has many more records, the same; and the job still ends, by its checks."""
    seed_accounts(800)
    job_id = start(client, auth, page_size=20, fanout=2)
    rt = runtime.of(app)
    root = task_queue.queue.take()
    assert task_queue.deliver(root)

    def ending_reads():
        """(reads of a task end adding its credit to the lost sum, reads of a whole delivery of the ended root again,
        the job's records)."""
        rt.cache.flush()  # the running sum is gone (and the job from ndb's global cache: read from Datastore)
        with rt.context():
            job = MapperJob.get_by_id(job_id)
            assert not job.ended
            with costs.measured() as cost:
                completion.end_if_all_back(job, 1)  # a credit of 1 to a sum the cache no longer has: changes nothing
            count = len(completion.records(job))
        rt.cache.flush()
        assert task_queue.deliver(root._replace(delivery=1))  # reads its record, finds it ended: passes 0 on
        return cost.billed.reads, billed_from_header(task_queue.timings[-1]).reads, count

    task_queue.drain(max_deliveries=2)
    early = ending_reads()
    task_queue.drain(max_deliveries=15)
    late = ending_reads()
    assert late[2] >= early[2] + 10, (early, late)  # many more records, which an end summing them would read
    assert late[:2] == early[:2], (early, late)
    task_queue.drain()
    final = job_status(client, job_id)
    assert (final["state"], final["processed"]) == ("done", 800), final


def test_the_sweep_sums_the_records_itself_though_the_jobs_checks_are_spent(app, client, auth, task_queue,
                                                                           monkeypatch):
    """A job's checks are one chain of named tasks, spent after MAX_CHECKS (about two hours) while credit is still out,
    and a queue drops a name it has used. If then its last task's delivery dies between its final commit and adding its
    credit to the running sum, no check is coming: the sweep must sum the records itself, not queue a check."""
    seed_accounts(90)
    job_id = start(client, auth, page_size=30, fanout=2)
    root = task_queue.queue.take()
    assert task_queue.deliver(root)  # its page, and its children queued
    children = [task_queue.queue.take() for _ in range(len(task_queue.queue.pending))]
    assert children
    with runtime.current().context():
        completion._check_later(job_id, 1)  # as a task end that found no running sum queues it
    checks = task_queue.drain()  # the chain, run out while the children are still out
    assert checks == completion.MAX_CHECKS and job_status(client, job_id)["state"] == "running"
    monkeypatch.setattr(completion, "end_if_all_back", lambda job, returned: None)  # each dead before its incr
    assert all(task_queue.deliver(child) for child in children)
    monkeypatch.undo()
    assert job_status(client, job_id)["state"] == "running" and not task_queue.queue.pending
    run_out_lease(f"{job_id}-0")  # the root's, kept while it ended until the sweep sees its children's records
    assert swept()["summed"] == [job_id]
    task_queue.drain()
    final = job_status(client, job_id)
    assert (final["state"], final["processed"]) == ("done", 90), final


def test_a_task_redelivered_after_its_delivery_died_before_adding_its_credit_ends_the_job(app, client, auth,
                                                                                           task_queue, monkeypatch):
    """A delivery that died between its record's final commit and adding its credit to the running sum leaves the sum
    short for good; the queue's redelivery finds the record ended and has nothing to add: it leaves the sum alone and
    has the job's checks sum the records, which end the job (no sweep needed)."""
    keys = seed_accounts(30)
    job_id = start(client, auth, page_size=100)  # one task
    root = task_queue.queue.take()
    monkeypatch.setattr(completion, "end_if_all_back", lambda job, returned: None)  # dead before its incr
    assert task_queue.deliver(root)
    monkeypatch.undo()
    assert job_status(client, job_id)["state"] == "running" and not task_queue.queue.pending
    assert task_queue.deliver(root._replace(delivery=1))  # the queue's redelivery
    task_queue.drain()  # the job's check
    final = job_status(client, job_id)
    assert (final["state"], final["processed"]) == ("done", 30), final
    assert balances(keys) == [10] * 30
