"""Accounts: seeding many of them, summing their balances, and the mapper job that credits every one exactly once."""
import hashlib
import secrets

from google.cloud import ndb

from accounts.models import Account
from core import runtime
from core.errors import BadInput
from core.validate import whole_number
from mapper import service as mapper

MAX_SEED = 100_000
SEED_BATCH = 500  # accounts per seed task: one put_multi
SEED_HANDLER = "accounts.seed"
MAX_AMOUNT = 1_000_000
SUMMARY_KEY = "accounts:summary"
# The summary comes from a non-ancestor query, eventually consistent: a total read a moment after a seed task may miss
# some of its accounts and be cached so. Dropping the entry after every seed task and job bounds that to this lifetime.
SUMMARY_LIFETIME = 30


def account_key(seed_id, number):
    """A scattered id computed from the seed and the account's number, so that a seed task delivered twice writes the
    same accounts, not twice as many. Ids below 2**52, like Datastore's own scattered ids; no Account key is ever
    allocated by Datastore, so no auto id can collide with these."""
    digest = hashlib.sha256(f"{seed_id}:{number}".encode()).digest()
    return ndb.Key(Account, int.from_bytes(digest[:8], "big") % (2 ** 52 - 1) + 1)


def seed(count):
    """Create `count` accounts with a zero balance, in the background (tasks of SEED_BATCH); the seed's id."""
    count = whole_number(count, "count", 1, MAX_SEED)
    seed_id = secrets.token_hex(6)
    for start in range(0, count, SEED_BATCH):
        runtime.tasks().enqueue(SEED_HANDLER, {"seed": seed_id, "start": start,
                                               "stop": min(start + SEED_BATCH, count)}, f"seed-{seed_id}-{start}")
    return {"seed": seed_id, "count": count, "tasks": -(-count // SEED_BATCH)}


def seed_batch(payload, attempt=0):
    """One seed task: the accounts of its numbers that do not exist yet (a retry must not zero a credited one)."""
    keys = [account_key(payload["seed"], n) for n in range(payload["start"], payload["stop"])]
    missing = [k for k, a in zip(keys, ndb.get_multi(keys), strict=True) if a is None]
    ndb.put_multi([Account(key=k, balance=0) for k in missing])
    forget_summary()
    return {"created": len(missing)}


def summary():
    """How many accounts there are and their total balance, cached: summing them reads every account's balance (a
    projection query on the balance index, ~0.2 s for 1,000 on the emulator), too slow for each page view."""
    cache = runtime.cache()
    cached = cache.get(SUMMARY_KEY)
    if cached is not None:
        count, total = (int(n) for n in cached.split(b" "))
        return {"count": count, "total_balance": total}
    count = total = 0
    for account in Account.query().iter(projection=[Account.balance]):
        count += 1
        total += account.balance
    cache.add(SUMMARY_KEY, f"{count} {total}", expire=SUMMARY_LIFETIME)
    return {"count": count, "total_balance": total}


def forget_summary(_job=None):
    """Drop the cached summary (after accounts were added or credited)."""
    runtime.cache().delete(SUMMARY_KEY)


def _credit_params(params):
    unknown = set(params) - {"amount"}
    if unknown:
        raise BadInput(f"Unknown params: {', '.join(sorted(unknown))}.", "bad_params")
    return {"amount": whole_number(params.get("amount"), "amount", 1, MAX_AMOUNT)}


def _credit(accounts, params, prepared):
    # Inside the chunk's transaction, with the task's record: committed together, so each account gets the credit
    # exactly once however often the task is delivered or dies half way.
    for account in accounts:
        account.balance += params["amount"]
    return accounts


ADD_CREDIT = mapper.Job(
    name="add_credit", kind="Account", title="Give every account credit",
    description="Adds the amount to every account's balance, exactly once each, even when tasks are retried.",
    apply=_credit, parse_params=_credit_params, fields=(("amount", "Amount", 10),),
    on_done=forget_summary,
    chunk=mapper.MAX_GROUPS - 1)  # the accounts and the task's record: as many as one transaction may touch
