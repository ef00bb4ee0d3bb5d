"""A blog or feed: a page's bill by index and by offset at a depth, the front page's cache hit rate that keeps its
reads under a budget, and the posts a second one blog takes in turn (each holds the blog's index entity)."""
from blog.service import PAGE_SIZE as BLOG_PAGE
from core import billing
from planner import figures
from planner.figures import Plan, calls_in_turn, priced, sustained_rate


def front_page_reads(entries: int, page: int = BLOG_PAGE) -> int:
    """Billed reads of the front page rendered from Datastore (a cache miss): the BlogIndex, the page and one entry
    more (fetch PAGE+1), and one Lookup of the shown entries' comment counters, each key billed found or not
    (blog/service.py get_page; bench/results/blog.md's `datastore` front page)."""
    return 1 + page_reads(entries, 0, page)[0] + min(page, entries)


def page_reads(entries: int, depth: int, page: int = BLOG_PAGE) -> tuple[int, int]:
    """(billed reads of a page by index, by offset) `depth` entries below the newest of `entries`. By index: the page
    and one more entry, the next page's marker (fetch PAGE+1), as many as remain. By offset: every skipped entry is
    billed as a read, then the page."""
    left = entries - depth
    return min(page + 1, left), depth + min(page, left)


def plan_blog(entries: int, depth: int, readers_per_second: int, read_budget_per_second: int,
              posts_per_second: int = 1, profile: str = "production") -> Plan:
    """A blog of `entries` read `readers_per_second` on its front page: a page's bill by index and by offset at
    `depth`, the front page's cache hit rate that keeps its reads under `read_budget_per_second`, and the posts a
    second one blog can take in turn."""
    plan = Plan("blog", {"entries": entries, "depth": depth, "readers_per_second": readers_per_second,
                         "read_budget_per_second": read_budget_per_second, "posts_per_second": posts_per_second,
                         "profile": profile})
    for name, value, unit in (("entries", entries, "entries"), ("depth", depth, "entries"),
                              ("front page readers a second", readers_per_second, "views/s"),
                              ("read budget", read_budget_per_second, "reads/s"),
                              ("posts a second", posts_per_second, "posts/s")):
        plan.figure(name, value, unit, "yours", "")
    page = plan.figure("page size", BLOG_PAGE, "entries", "app", "blog/service.py PAGE_SIZE")
    by_index, by_offset = page_reads(entries, depth)
    plan.line(f"by index: min({page:g} + 1, {entries} - {depth}) = {by_index} reads (the page and the next "
              "page's first entry, found by its index)")
    plan.line(f"by offset: {depth} skipped + min({page:g}, {entries} - {depth}) = {by_offset} reads (production "
              "bills every entity an offset skips)")
    index_usd = priced(plan, billing.Billed(reads=by_index), "a page by index")
    offset_usd = priced(plan, billing.Billed(reads=by_offset), "a page by offset")
    plan.answer("index_reads", "A page by index, billed reads", by_index,
                f"{by_index} reads, ${index_usd:.2f} a million")
    plan.answer("offset_reads", "A page by offset, billed reads", by_offset,
                f"{by_offset} reads, ${offset_usd:.2f} a million ({by_offset / by_index:.0f}x)")

    front = front_page_reads(entries)
    plan.line(f"a front page rendered on a miss: 1 BlogIndex + {page_reads(entries, 0)[0]} entries + "
              f"{min(BLOG_PAGE, entries)} comment counters (one Lookup) = {front} reads")
    misses = min(1.0, read_budget_per_second / (front * readers_per_second))
    plan.line(f"front page: {readers_per_second} views/s x {front} reads a miss x (1 - hit rate) <= "
              f"{read_budget_per_second} reads/s, so hit rate >= 1 - {read_budget_per_second} / "
              f"({front} x {readers_per_second}) = {1 - misses:.4f}")
    plan.answer("hit_rate", "Front page cache hit rate needed", round(1 - misses, 4), f"{(1 - misses) * 100:.2f}%")

    median, _ = calls_in_turn(plan, figures.TRANSACTION, 0, profile,
                              "a post holds the blog's index entity (its transaction)")
    rate = sustained_rate(plan)
    in_turn = 1000 / median
    plan.line(f"posts take turns on one index entity: at most 1000 / {median:.1f} = {in_turn:.1f} posts/s under the "
              f"model; production's guidance: {rate:g} a second sustained")
    fits = posts_per_second <= rate
    plan.answer("posts_in_turn", "Posts a second one blog takes in turn", rate,
                f"{rate:g} sustained (production's guidance; {in_turn:.1f} at most under the model): "
                + (f"{posts_per_second}/s fits" if fits else f"{posts_per_second}/s does not: split the blog"))
    plan.answer("post_rpcs", "A post's critical path, RPCs", sum(figures.TRANSACTION.values()),
                f"{sum(figures.TRANSACTION.values())} RPCs in turn")
    return plan
