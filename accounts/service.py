"""Accounts: seeding, their summary, and the audit (the credit job: credit.py). The summary is never counted from the
accounts (the talk: `Model.count()` is O(N)): `count` and `balance` are sharded counters, each moved exactly once, in
the transaction that creates a seed chunk's accounts or ends a credit job; the audit recounts them.
"""
import hashlib
import math
import secrets
import time
from typing import Any

from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from accounts.models import Account, AccountsAudit, SeedMarker
from core import clock, idempotency, runtime
from core.exactly_once import Written, once
from core.validate import text, whole_number
from counters import service as counters
from mapper import jobs as mapper_jobs
from mapper.key_arithmetic import ID_CEILING
from mapper.models import MapperJob

MAX_SEED = 100_000
SEED_BATCH = 500  # accounts per seed task
SEED_HANDLER = "accounts.seed"
SEED_ENDPOINT = "accounts.seed"  # what a seed's Idempotency-Key is scoped to, with its caller
# The kept figures, created up front with all their shards: creating a counter inside many transactions at once would
# make them collide on its config.
COUNTERS = counters.owned("accounts")
COUNT, BALANCE = "count", "balance"
KEPT_SHARDS = 16
SUMMARY_KEY = "accounts-summary"
SUMMARY_LIFETIME = 5  # seconds a visitor's copy of the summary lives, as a counter's shard view (counters/totals.py)
# A transaction may touch 25 entity groups on the legacy emulator (Datastore before Firestore); every Account is one.
# A counter added to in a transaction takes two more (its config and a shard), a mapper chunk one more (its record).
SEED_CHUNK = mapper_jobs.MAX_GROUPS - 2
ACCOUNTS_CHUNK_FIRESTORE = 100  # accounts of about 100 bytes: far below 10 MiB a transaction; a default page


def account_key(seed_id: str, number: int) -> ndb.Key:
    """A scattered id from the seed and the account's number, so a seed task delivered twice writes the same accounts;
    below ID_CEILING, where the mapper's key arithmetic aims (no Account id is ever allocated by Datastore)."""
    digest = hashlib.sha256(f"{seed_id}:{number}".encode()).digest()
    return ndb.Key(Account, int.from_bytes(digest[:8], "big") % (ID_CEILING - 1) + 1)


def keep_figures() -> None:
    """Create the kept figures' counters when they do not exist yet; once they do, one batched get."""
    for short, config in zip((COUNT, BALANCE), COUNTERS.configs((COUNT, BALANCE)), strict=True):
        if config is None or config.num_shards < KEPT_SHARDS:
            COUNTERS.configure(short, KEPT_SHARDS)


def seed(count: object, idempotency_key: str | None = None, user: str = "") -> tuple[dict[str, Any], bool]:
    """Create `count` accounts with a zero balance, in tasks of SEED_BATCH: (the seed's answer, replayed). With an
    idempotency key a SeedMarker keeps the first answer and the seed's id is derived from the key, so a resend
    enqueues tasks of the same names and accounts of the same keys: no account twice (another count: a 409)."""
    how_many = whole_number(count, "count", 1, MAX_SEED, from_json=True)
    request = idempotency.keyed(idempotency_key, user or None, SEED_ENDPOINT, None, {"count": how_many})
    keep_figures()
    seed_id = idempotency.derived_id(request, 12) if request else secrets.token_hex(6)
    answer = {"seed": seed_id, "count": how_many, "tasks": -(-how_many // SEED_BATCH)}
    replayed = request is not None and _mark_seed(request, answer)
    for start in range(0, how_many, SEED_BATCH):
        runtime.tasks().enqueue(SEED_HANDLER, {"seed": seed_id, "start": start,
                                               "stop": min(start + SEED_BATCH, how_many)}, f"seed-{seed_id}-{start}")
    return answer, replayed


def _mark_seed(request: idempotency.Keyed, answer: dict[str, Any]) -> bool:
    """Write the seed's marker unless it exists: whether it did (a replay; a 409 when for another count). Its tasks
    are named by the seed's id, so the marker needs no transaction with them."""
    key = ndb.Key(SeedMarker, request.name)
    return once(lambda: idempotency.written(key.get(retries=0), request),
                lambda _, stamp: SeedMarker.new(key, request, stamp, answer).put(),
                hot_key=key).by_another


def seed_batch(payload: dict[str, Any], delivery: int = 0) -> dict[str, int]:
    """One seed task: the accounts of its numbers that do not exist yet, SEED_CHUNK to a transaction. A payload `seed`
    did not make (numbers beyond MAX_SEED or more than SEED_BATCH of them) is a 422 that writes nothing."""
    seed_id = text(payload.get("seed"), "seed", 64)
    start = whole_number(payload.get("start"), "start", 0, MAX_SEED - 1, from_json=True)
    stop = whole_number(payload.get("stop"), "stop", start + 1, min(start + SEED_BATCH, MAX_SEED), from_json=True)
    keys = [account_key(seed_id, n) for n in range(start, stop)]
    created = sum(_create_missing(keys[i:i + SEED_CHUNK]) for i in range(0, len(keys), SEED_CHUNK))
    return {"created": created}


def _create_missing(keys: list[ndb.Key]) -> int:
    """In one transaction: create the accounts of `keys` that do not exist and add them to the kept count; how many
    this call created. A retried task finds them created and neither zeroes them (they may be credited since) nor
    counts them again; this call's own retry after an UNKNOWN commit finds its own stamp."""
    def look() -> Written | list[ndb.Key]:
        found = ndb.get_multi(keys, retries=0)
        missing = [k for k, a in zip(keys, found, strict=True) if a is None]
        return missing or Written(found[-1].created_by, len(keys))

    def create(missing: list[ndb.Key], stamp: str) -> int:
        ndb.put_multi([Account(key=k, balance=0, created_by=stamp) for k in missing]
                      + COUNTERS.add_in_transaction(COUNT, len(missing)))
        return len(missing)
    created = once(look, create)
    return 0 if created.by_another else created.value


def summary(exactly: bool = True) -> dict[str, int]:
    """The accounts' count and total balance from the kept figures; not `exactly`: a copy kept SUMMARY_LIFETIME."""
    if not exactly:
        return runtime.cache().kept_copy(SUMMARY_KEY, SUMMARY_LIFETIME, summary)
    kept = COUNTERS.exact_totals([COUNT, BALANCE])
    return {"count": kept[COUNT], "total_balance": kept[BALANCE]}


# --- the audit: recount the accounts, compare with the kept figures --------------------------------------------------

def _audit_tally(accounts: list[Account], params: dict[str, Any]) -> dict[str, int]:
    return {COUNT: len(accounts), BALANCE: sum(a.balance for a in accounts)}


def _record_audit(job: MapperJob) -> list[AccountsAudit]:
    """The finished audit's on_done: its tally beside the kept figures, to be written with the follow-up's mark."""
    if job.outcome != "done":
        return []  # cancelled or failed: it did not read every account
    kept = COUNTERS.exact_totals([COUNT, BALANCE])
    tally = (job.summary or {}).get("tally", {})
    return [AccountsAudit(id=AccountsAudit.LATEST, job=job.id, found_count=tally.get(COUNT, 0),
                          found_balance=tally.get(BALANCE, 0), kept_count=kept[COUNT], kept_balance=kept[BALANCE])]


AUDIT = mapper_jobs.JobDefinition(
    name="audit_accounts", kind="Account", title="Audit the accounts' summary",
    description="Counts every account and sums their balances (in parallel, each account once) and compares the "
                "result with the figures the app keeps. Exact when nothing seeds or credits meanwhile.",
    apply=lambda accounts, params, prepared: [], tally=_audit_tally, on_done=_record_audit,
    per_transaction=mapper_jobs.MAX_GROUPS - 1,  # reads only: accounts, the record
    per_transaction_firestore=ACCOUNTS_CHUNK_FIRESTORE)


def latest_audit() -> dict[str, Any] | None:
    """The newest audit's result, or None: a get by key, whatever the number of accounts."""
    audit = AccountsAudit.get_by_id(AccountsAudit.LATEST)
    if audit is None:
        return None
    found = {"count": audit.found_count, "total_balance": audit.found_balance}
    kept = {"count": audit.kept_count, "total_balance": audit.kept_balance}
    return {"job": audit.job, "finished": clock.iso(audit.created), "ok": found == kept, "found": found, "kept": kept}


# --- the lesson in 2026: the kept figures beside COUNT and SUM aggregation queries -----------------------------------

def compare_with_aggregation() -> dict[str, Any]:
    """Read the kept figures and run COUNT and SUM over the accounts, each timed, now; what each read. The aggregation
    reads one index entry per account, so it grows with them (the legacy emulator has none): an admin's, never a
    page view's."""
    start = time.perf_counter()
    kept = summary()  # two counters, each its config and KEPT_SHARDS shards
    result: dict[str, Any] = {"kept": {**kept, "ms": round((time.perf_counter() - start) * 1000, 1),
                                       "entity_reads": 2 * (1 + KEPT_SHARDS)}}
    start = time.perf_counter()
    try:
        count, total = runtime.current().datastore.aggregations.count_and_sum(Account._get_kind(), "balance")
    except core_exceptions.MethodNotImplemented:
        result["aggregation"] = {"available": False,
                                 "reason": "This datastore has no aggregation queries (the legacy emulator answers "
                                           "501 UNIMPLEMENTED, as Datastore did before Firestore)."}
        return result
    result["aggregation"] = {"available": True, "count": count, "total_balance": total,
                             "ms": round((time.perf_counter() - start) * 1000, 1), "index_entries": count,
                             "billed_reads": max(1, math.ceil(count / 1000))}
    return result
