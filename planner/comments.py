"""Comments on one entry: each writer's own entity group against one shared parent, and each design's bill."""
import math

from core import billing
from core.costs import plural
from core.settings import WriteBudget
from planner.figures import INCREMENT_BILL, TRANSACTION, Plan, Rate, calls_in_turn, priced, sustained_rate

# A comment (comments/service.py post_comment): one transaction on the writer's own group, reading their sequence and
# writing it with the comment; then +1 on the entry's comment counter. The shared design: one sequence for everyone.
COMMENT_BILL = billing.Billed(reads=1, writes=2)


def comment_bills(backend: str) -> tuple[billing.Billed, billing.Billed]:
    """(a designed comment's bill, a shared-sequence comment's): the designed one also counts itself on a shard of
    the entry's counter (an increment on `backend`)."""
    return COMMENT_BILL + INCREMENT_BILL[backend], COMMENT_BILL


def plan_comments(comments: Rate, writers: int, backend: str = "firestore", profile: str = "production") -> Plan:
    """`comments` on one entry from `writers` people (the module's question, with the write budget each meets)."""
    plan = Plan("comments", {**comments.as_input("comments"), "writers": writers, "backend": backend,
                             "profile": profile})
    comments_per_second = plan.rate("comments on one entry", comments, "comments")
    plan.figure("writers", writers, "people", "yours", "")
    rate = sustained_rate(plan)
    per_writer = comments_per_second / writers
    designed = rate / per_writer
    shared = rate / comments_per_second
    plan.line(f"designed: each writer's own group takes {comments_per_second:.4g} / {writers} = {per_writer:.3g} "
              f"comments/s; headroom {rate:g} / {per_writer:.3g} = {designed:.3g}x")
    plan.line(f"shared parent: one entity takes all {comments_per_second:.4g} comments/s; headroom {rate:g} / "
              f"{comments_per_second:.4g} = {shared:.3g}x")
    plan.answer("designed_headroom", "Per-user groups' headroom", round(designed, 3),
                f"{designed:.3g}x" + (" (fits)" if designed >= 1 else " (each writer too fast for their group)"))
    plan.answer("shared_headroom", "One shared parent's headroom", round(shared, 3),
                f"{shared:.3g}x" + (" (fits)" if shared >= 1 else " (over the guidance: the writers queue)"))
    write_budget(plan, per_writer, writers)
    shards = math.ceil(comments_per_second / rate)
    plan.line(f"the entry's comment counter: ceil({comments_per_second:.4g} / {rate:g}) = {plural(shards, 'shard')}")
    plan.answer("counter_shards", "The comment counter's shards", shards, plural(shards, "shard"))
    median, _ = calls_in_turn(plan, TRANSACTION, 0, profile, "a comment's transaction")
    in_turn = 1000 / median
    plan.line(f"shared: comments in turn at most 1000 / {median:.1f} = {in_turn:.1f}/s under the model")
    plan.answer("shared_in_turn", "Shared parent, comments a second in turn (model)", round(in_turn, 1),
                f"{in_turn:.1f}/s")
    designed_bill, shared_bill = comment_bills(backend)
    plan.figure("a comment's own transaction", COMMENT_BILL.reads + COMMENT_BILL.writes, "operations", "app",
                "comments/service.py post_comment: read the sequence, write it and the comment")
    priced(plan, designed_bill, f"a designed comment ({backend}: with its count)",
           answer=("designed_bill", "A designed comment, USD a million"))
    priced(plan, shared_bill, "a shared-sequence comment",
           answer=("shared_bill", "A shared-sequence comment, USD a million"))
    return plan


def write_budget(plan: Plan, per_writer: float, writers: int) -> None:
    """The per-person write budget as the code sets it (a deployment may change it with WRITE_BUDGET; core/budget.py):
    a writer faster than budget / window meets its 429 before any entity's limit."""
    budget = WriteBudget()
    most = plan.figure("comments one person may post a window", budget.comments, "comments", "app",
                       "core/settings.py WriteBudget, enforced by core/budget.py spend (WRITE_BUDGET overrides it)")
    window = plan.figure("the write budget's window", budget.window, "s", "app", "core/settings.py WriteBudget")
    allowed = most / window
    plan.line(f"the write budget: {most:g} comments in {window:g} s a person = {allowed:.3g} comments/s sustained; "
              f"{writers} writers at most {writers * allowed:.4g} comments/s on the entry")
    minutes = f"{window / 60:g} minutes" if window % 60 == 0 else f"{window:g} s"
    if per_writer <= allowed:
        text = f"{most:g} comments in {minutes} a person, then 429: each writer's {per_writer:.3g}/s stays within it"
    else:
        spent = most / per_writer
        text = (f"{most:g} comments in {minutes} a person, then 429 until the window ends: each writer's "
                f"{per_writer:.3g}/s spends it in {spent:.0f} s, before any entity's limit")
    plan.answer("write_budget", "The per-person write budget", most, text)
