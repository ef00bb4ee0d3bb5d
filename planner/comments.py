"""Comments on one entry: each writer's own entity group against one shared parent, and each design's bill."""
import math

from core import billing
from planner import figures
from planner.figures import Plan, calls_in_turn, priced, sustained_rate

# A comment (comments/service.py post_comment): one transaction on the writer's own group, reading their sequence and
# writing it with the comment; then +1 on the entry's comment counter. The shared design: one sequence for everyone.
COMMENT_BILL = billing.Billed(reads=1, writes=2)


def comment_bills(backend: str) -> tuple[billing.Billed, billing.Billed]:
    """(a designed comment's bill, a shared-sequence comment's): the designed one also counts itself on a shard of
    the entry's counter (an increment on `backend`)."""
    return COMMENT_BILL + figures.INCREMENT_BILL[backend], COMMENT_BILL


def plan_comments(comments_per_second: int, writers: int, backend: str = "firestore",
                  profile: str = "production") -> Plan:
    """`comments_per_second` on one entry from `writers` people: each writer's own group's headroom against one shared
    parent, the entry's counter shards, and each design's bill."""
    plan = Plan("comments", {"comments_per_second": comments_per_second, "writers": writers, "backend": backend,
                             "profile": profile})
    plan.figure("comments a second on one entry", comments_per_second, "comments/s", "yours", "")
    plan.figure("writers", writers, "people", "yours", "")
    rate = sustained_rate(plan)
    per_writer = comments_per_second / writers
    designed = rate / per_writer
    shared = rate / comments_per_second
    plan.line(f"designed: each writer's own group takes {comments_per_second} / {writers} = {per_writer:.3g} "
              f"comments/s; headroom {rate:g} / {per_writer:.3g} = {designed:.3g}x")
    plan.line(f"shared parent: one entity takes all {comments_per_second} comments/s; headroom {rate:g} / "
              f"{comments_per_second} = {shared:.3g}x")
    plan.answer("designed_headroom", "Per-user groups' headroom", round(designed, 3),
                f"{designed:.3g}x" + (" (fits)" if designed >= 1 else " (each writer too fast for their group)"))
    plan.answer("shared_headroom", "One shared parent's headroom", round(shared, 3),
                f"{shared:.3g}x" + (" (fits)" if shared >= 1 else " (over the guidance: the writers queue)"))
    shards = math.ceil(comments_per_second / rate)
    plan.line(f"the entry's comment counter: ceil({comments_per_second} / {rate:g}) = {shards} shards")
    plan.answer("counter_shards", "The comment counter's shards", shards, f"{shards} shards")
    median, _ = calls_in_turn(plan, figures.TRANSACTION, 0, profile, "a comment's transaction")
    in_turn = 1000 / median
    plan.line(f"shared: comments in turn at most 1000 / {median:.1f} = {in_turn:.1f}/s under the model")
    plan.answer("shared_in_turn", "Shared parent, comments a second in turn (model)", round(in_turn, 1),
                f"{in_turn:.1f}/s")
    designed_bill, shared_bill = comment_bills(backend)
    plan.figure("a comment's own transaction", COMMENT_BILL.reads + COMMENT_BILL.writes, "operations", "app",
                "comments/service.py post_comment: read the sequence, write it and the comment")
    designed_usd = priced(plan, designed_bill, f"a designed comment ({backend}: with its count)")
    shared_usd = priced(plan, shared_bill, "a shared-sequence comment")
    plan.answer("designed_bill", "A designed comment, USD a million", round(designed_usd, 2),
                designed_bill.priced())
    plan.answer("shared_bill", "A shared-sequence comment, USD a million", round(shared_usd, 2), shared_bill.priced())
    return plan
