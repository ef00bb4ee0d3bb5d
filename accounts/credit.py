"""The add_credit job, lesson 4's example. `credit` is its map step, the talk's `account.balance += amount`, which the
mapper runs in each chunk's transaction with the task's record: each account credited once however often a task is
delivered or dies. `settle` adds the job's tally, its whole credit, once, at its end, to the accounts' total balance.
Beyond the talk, add_credit_increments: the same change written as increments, protobufs past ndb (a tenth of its
client CPU) and on Firestore the server's, unread (mapper/increments.py); the benchmarks run it; a test holds them
equal."""
import dataclasses
from typing import Any

from google.cloud import ndb

from accounts.models import Account
from accounts.service import ACCOUNTS_CHUNK_FIRESTORE, COUNTERS, keep_figures
from accounts.service import BALANCE as TOTAL_BALANCE  # the counter of all accounts' balances
from core.errors import Unprocessable
from core.validate import whole_number
from mapper import jobs as mapper_jobs

MAX_AMOUNT = 1_000_000
CREDIT_CHUNK = mapper_jobs.MAX_GROUPS - 1  # legacy's 25 entity groups: 24 accounts and the task's record


def credit(accounts: list[Account], params: dict[str, Any], prepared: None) -> list[Account]:
    """The map step: each account of the chunk gets the amount, in the chunk's transaction (`prepared`: what a job's
    `prepare` read once for the page; add_credit has none)."""
    for account in accounts:
        account.balance += params["amount"]
    return accounts


def _settle_credit(tally: dict[str, int], params: dict[str, Any]) -> list[ndb.Model]:
    """The job's whole credit onto the accounts' total balance, in the transaction that ends the job (once)."""
    return COUNTERS.add_in_transaction(TOTAL_BALANCE, tally[TOTAL_BALANCE]) if tally.get(TOTAL_BALANCE) else []


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
    apply=credit, tally=lambda accounts, params: {TOTAL_BALANCE: params["amount"] * len(accounts)},  # its credit
    settle=_settle_credit, parse_params=_credit_params, fields=(("amount", "Amount", 10),),
    per_transaction=CREDIT_CHUNK, per_transaction_firestore=ACCOUNTS_CHUNK_FIRESTORE)
ADD_CREDIT_INCREMENTS = dataclasses.replace(  # `credit` as increments of each account's property
    ADD_CREDIT, name="add_credit_increments", title="Give every account credit, as increments", description="The "
    "same credit written as increments: on Firestore the server's.", increments=lambda p: {"balance": p["amount"]})
