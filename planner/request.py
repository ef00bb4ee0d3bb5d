"""A request: its RPCs and cache calls made in turn (or a request /appstats recorded), its time on the critical path
and its bill, as if served in production."""
from collections import Counter
from typing import Any

from appstats import captures
from core import billing, costs, runtime
from core.costs import plural
from planner.figures import Plan, calls_in_turn, priced

# Requests a person would not plan: the planner's own answers and signing in or out (they would crowd the list).
NOT_LISTED = ("/numbers/plan", "/api/plan", "/signin", "/signout", "/api/session")


def plan_request(rpcs: dict[str, int], cache_calls: int = 0, reads: int = 0, writes: int = 0, deletes: int = 0,
                 profile: str = "production", whose: str = "yours", source: str = "") -> Plan:
    """A request's calls made one after another: its wait at the model's medians and p99s, and its bill."""
    plan = Plan("request", {"rpcs": rpcs, "cache_calls": cache_calls, "reads": reads, "writes": writes,
                            "deletes": deletes, "profile": profile})
    for method, n in sorted(rpcs.items()):
        plan.figure(f"{method} RPCs", n, "RPCs", whose, source)
    plan.figure("cache calls", cache_calls, "calls", whose, source)
    for kind, n in (("reads", reads), ("writes", writes), ("deletes", deletes)):
        if n:
            plan.figure(f"billed {kind}", n, kind, whose, source)
    median, p99 = calls_in_turn(plan, rpcs, cache_calls, profile, "the calls in turn")
    plan.answer("rpcs", "Datastore RPCs on the critical path", sum(rpcs.values()), plural(sum(rpcs.values()), "RPC"))
    plan.answer("median_ms", "Time waiting, model medians", round(median, 1), f"{median:.1f} ms")
    plan.answer("p99_ms", "Time waiting, every call at its p99", round(p99, 1), f"{p99:.1f} ms")
    priced(plan, billing.Billed(reads=reads, writes=writes, deletes=deletes), "its bill",
           answer=("usd_per_million", "Billed, USD a million such requests"))
    return plan


def recent_requests() -> list[dict[str, Any]] | None:
    """The requests /appstats lists that a person may pick to plan; None while the cache does not answer."""
    try:
        listed = captures.recent(runtime.current().cache)
    except captures.Away:
        return None
    return [r for r in listed if r["path"].partition("?")[0] not in NOT_LISTED]


def plan_recorded(request_id: int, profile: str = "production") -> Plan:
    """A request /appstats recorded, as if served in production: `plan_request` of its critical path and its bill."""
    record, calls = captures.kept_request(runtime.current().cache, request_id)
    critical = [calls[i] for i in sorted(costs.critical_path(calls))]
    rpcs = Counter(call.name for call in critical if call.kind == "datastore")
    billed = record["billed"]
    plan = plan_request(dict(rpcs), sum(call.kind == "cache" for call in critical), billed["reads"],
                        billed["writes"], billed["deletes"], profile, whose="record",
                        source=f"/appstats request {request_id}, {record['at']}")
    plan.inputs = {"appstats": request_id, "profile": profile}
    plan.arithmetic.insert(0, f"request {request_id}, {record['method']} {record['path'][:200]}: "
                              f"{plural(len(critical), 'call')} of its {len(calls)} kept on its critical path "
                              "(each made after the one before it was answered), its bill as counted")
    return plan
