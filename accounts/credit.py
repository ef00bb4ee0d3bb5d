"""The add_credit job: in effect each chunk's transaction does `account.balance += amount` for its accounts and writes
them with the task's record (as increments: bulk.py `PageWork.change`; on Firestore the server adds): each credited
once however often a task is delivered or dies (a job with `apply` instead: comments/recount.py). The mapper tallies
amount x accounts; `settle` gets the job's whole credit once, at its end, and adds it to the accounts' total balance, a
sharded counter. BALANCE: in `_credit` each Account's property, in `_settle_credit` the counter."""
from typing import Any

from google.cloud import ndb

from accounts.service import ACCOUNTS_CHUNK_FIRESTORE, BALANCE, COUNTERS, keep_figures
from core.errors import Unprocessable
from core.validate import whole_number
from mapper import jobs as mapper_jobs

MAX_AMOUNT = 1_000_000
CREDIT_CHUNK = mapper_jobs.MAX_GROUPS - 1  # legacy's 25 entity groups: 24 accounts and the task's record


def _credit(params: dict[str, Any]) -> dict[str, int]:
    """What the job adds to each account's balance: an increment, written and tallied by the mapper in each chunk."""
    return {BALANCE: params["amount"]}


def _settle_credit(tally: dict[str, int], params: dict[str, Any]) -> list[ndb.Model]:
    """The job's whole credit onto the accounts' total balance, in the transaction that ends the job (once)."""
    return COUNTERS.add_in_transaction(BALANCE, tally[BALANCE]) if tally.get(BALANCE) else []


def _credit_params(params: dict[str, Any]) -> dict[str, int]:
    """The job's checked params; once valid, keep_figures makes the counters `settle` adds to with KEPT_SHARDS shards
    (its transaction would make a one-shard counter)."""
    if unknown := set(params) - {"amount"}:
        raise Unprocessable(f"Unknown params: {', '.join(sorted(unknown))}.", "bad_params")
    checked = {"amount": whole_number(params.get("amount"), "amount", 1, MAX_AMOUNT, from_json=True)}
    keep_figures()
    return checked


ADD_CREDIT = mapper_jobs.JobDefinition(
    name="add_credit", kind="Account", title="Give every account credit",
    description="Adds the amount to every account's balance, exactly once each, even when tasks are retried.",
    increments=_credit, settle=_settle_credit, parse_params=_credit_params,
    fields=(("amount", "Amount", 10),), per_transaction=CREDIT_CHUNK,
    per_transaction_firestore=ACCOUNTS_CHUNK_FIRESTORE)
