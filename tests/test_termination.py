"""The mapper's termination credit on the real stack (weight-throwing, mapper/task.py): a task that ends early after it
split hands back only the share it kept."""
import dataclasses

import pytest

from accounts.credit import ADD_CREDIT
from core import runtime, tasks
from mapper import completion, jobs
from mapper.models import MapperJob
from mapper.task import TOTAL_CREDIT, TaskRecord
from tests.test_mapper import balances, job_status, seed_accounts, start

DIES_AT = set()  # the keys of the accounts whose chunk always dies (test_dies_at's apply)


def _credit_dying_at(accounts, params, prepared):
    """add_credit through ndb's models, except that a chunk holding an account in DIES_AT dies, on every delivery."""
    if any(account.key in DIES_AT for account in accounts):
        raise RuntimeError("this chunk dies on every delivery")
    for account in accounts:
        account.balance += params["amount"]
    return accounts


DIES_AT_JOB = dataclasses.replace(ADD_CREDIT, name="test_dies_at", apply=_credit_dying_at, increments=None,
                                  tally=lambda accounts, params: {"balance": params["amount"] * len(accounts)},
                                  chunk_firestore=None)


def _records(job_id):
    with runtime.current().context():
        job = MapperJob.get_by_id(job_id)
        return completion.records(job), completion._hinted(job).returned


@pytest.mark.parametrize("root_first", [False, True], ids=["children_first", "root_first"])
@pytest.mark.parametrize("end", ["cancelled", "failed"])
def test_a_task_that_ends_early_after_it_split_hands_back_only_the_share_it_kept(end, root_first, app, client, auth,
                                                                                task_queue):
    """The root splits (its first chunk records its children and queues them), then dies half way through its page;
    it then ends early, cancelled or failed for good (its last allowed delivery dies too), before or after its
    children ended. Its children return their own shares: the root returns only what it kept. Were it to hand back
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
    assert 0 < split.kept_credit < split.credit == TOTAL_CREDIT
    if end == "cancelled":
        assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 200
    early_end = root._replace(attempt=1 if end == "cancelled" else tasks.MAX_ATTEMPTS - 1)
    if root_first:
        assert task_queue.deliver(early_end)
    task_queue.drain()  # the children (and, once every credit is back, nothing more)
    if not root_first:
        assert task_queue.deliver(early_end)
        task_queue.drain()
    final = job_status(client, job_id)
    assert (final["state"], final["progress"]) == (end, 1), final
    records, hinted = _records(job_id)
    assert {f"{job_id}-{child['task']}" for child in split.children} <= {r.key.id() for r in records}
    assert all(r.state != "running" for r in records)
    assert sum(r.returned for r in records) == TOTAL_CREDIT  # the whole, not more
    assert hinted == TOTAL_CREDIT  # the running sum the tasks added to, likewise
    root_record = next(r for r in records if r.key.id() == f"{job_id}-0")
    assert root_record.state == ("done" if end == "cancelled" else "failed")
    assert root_record.returned == root_record.kept_credit == split.kept_credit
    credited = sum(b == 10 for b in balances(keys))
    if end == "cancelled":  # only the root's chunks that committed before it died
        assert credited == final["processed"] == split.processed
    else:  # the children visited the rest of the range
        assert credited == final["processed"] == 300 - 100 + split.processed
