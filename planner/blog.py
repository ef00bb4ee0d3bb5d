"""A blog or feed: a page's bill by index and by offset at a depth, the front page's cache hit rate that keeps its
reads under a budget against the hit rate its posts let it reach, and the posts one blog takes in turn (each holds the
blog's index entity)."""
from blog.service import PAGE_LIFETIME
from blog.service import PAGE_SIZE as BLOG_PAGE
from core import billing
from core.costs import plural
from planner import figures
from planner.figures import Plan, Rate, a_unit, calls_in_turn, priced, sustained_rate

# A miss after a post: the BlogIndex by key (the post changed it: not in ndb's global cache), the page's query, and the
# new entry's comment counter. After the poster's own form, its redirect has read those two back into the caches, and
# the miss is the query alone. tests/test_plan.py measures both on the real stack.
AFTER_POST_RPCS = {"Lookup": 2, "RunQuery": 1}
AFTER_FORM_POST_RPCS = {"RunQuery": 1}


def front_page_reads(entries: int, page: int = BLOG_PAGE) -> int:
    """Billed reads of the front page rendered from Datastore with nothing cached (the cold worst case): the
    BlogIndex, the page and one entry more (fetch PAGE+1), and one Lookup of the shown entries' comment counters, each
    key billed found or not (blog/service.py get_page; bench/results/blog.md's `datastore` front page)."""
    return 1 + page_reads(entries, 0, page)[0] + min(page, entries)


def after_post_reads(entries: int, page: int = BLOG_PAGE, after_the_form: bool = False) -> int:
    """Billed reads of the front page's first view after a post (AFTER_POST_RPCS; AFTER_FORM_POST_RPCS
    `after_the_form`)."""
    return page_reads(entries, 0, page)[0] + (0 if after_the_form else 2)


def page_reads(entries: int, depth: int, page: int = BLOG_PAGE) -> tuple[int, int]:
    """(billed reads of a page by index, by offset) `depth` entries below the newest of `entries`. By index: the page
    and one more entry, the next page's marker (fetch PAGE+1), as many as remain. By offset: every skipped entry is
    billed as a read, then the page."""
    left = entries - depth
    return min(page + 1, left), depth + min(page, left)


def plan_blog(entries: int, depth: int, readers: Rate, read_budget: Rate, posts: Rate,
              profile: str = "production") -> Plan:
    """A blog of `entries` whose front page is viewed at the `readers` rate (the module's question)."""
    plan = Plan("blog", {"entries": entries, "depth": depth, **readers.as_input("readers"),
                         **read_budget.as_input("read_budget"), **posts.as_input("posts"), "profile": profile})
    plan.figure("entries", entries, "entries", "yours", "")
    plan.figure("depth", depth, "entries", "yours", "")
    views = plan.rate("front page views", readers, "views")
    budget = plan.rate("read budget", read_budget, "reads")
    posted = plan.rate("posts", posts, "posts")
    page = plan.figure("page size", BLOG_PAGE, "entries", "app", "blog/service.py PAGE_SIZE")
    by_index, by_offset = page_reads(entries, depth)
    plan.line(f"by index: min({page:g} + 1, {entries} - {depth}) = {plural(by_index, 'read')} (the page and the next "
              "page's first entry, found by its index)")
    plan.line(f"by offset: {depth} skipped + min({page:g}, {entries} - {depth}) = {plural(by_offset, 'read')} "
              "(production bills every entity an offset skips)")
    index_usd = priced(plan, billing.Billed(reads=by_index), "a page by index")
    offset_usd = priced(plan, billing.Billed(reads=by_offset), "a page by offset")
    plan.answer("index_reads", "A page by index, billed reads", by_index,
                f"{plural(by_index, 'read')}, ${index_usd:.2f} a million")
    plan.answer("offset_reads", "A page by offset, billed reads", by_offset,
                f"{plural(by_offset, 'read')}, ${offset_usd:.2f} a million ({by_offset / by_index:.0f}x)")

    cold, warm = front_page_reads(entries), after_post_reads(entries)
    plan.line(f"a front page rendered with nothing cached (the cold worst case): 1 BlogIndex + "
              f"{page_reads(entries, 0)[0]} entries + {min(BLOG_PAGE, entries)} comment counters (one Lookup) = {cold} "
              "reads")
    plan.line(f"the first view after a post (a miss as the running app pays it): 1 BlogIndex (the post changed it) + "
              f"{page_reads(entries, 0)[0]} entries + the new entry's comment counter = {warm} reads")
    warm_usd = priced(plan, billing.Billed(reads=warm), "a miss after a post")
    cold_usd = priced(plan, billing.Billed(reads=cold), "a cold miss")
    plan.answer("miss_reads", "A front page miss, billed reads", warm,
                f"{warm} reads after a post, ${warm_usd:.2f} a million (the running app's; "
                f"{after_post_reads(entries, after_the_form=True)} when the poster's form shows them the new entry "
                f"first); {cold} cold, nothing cached, ${cold_usd:.2f} a million (the worst case)")
    # The hit rate at which `views` a second, each miss billed so many reads, read at most `budget` a second.
    needed, needed_cold = (max(0.0, 1 - budget / (reads_a_miss * views)) for reads_a_miss in (warm, cold))
    plan.line(f"{views:g} {a_unit(views, 'views/s')} x {warm} reads a miss x (1 - hit rate) <= {budget:g} "
              f"{a_unit(budget, 'reads/s')}, so hit rate >= 1 - "
              f"{budget:g} / ({warm} x {views:g}) = {needed:.4f}; at {cold} reads a cold miss, {needed_cold:.4f}")
    plan.answer("hit_rate", "Front page cache hit rate needed", round(needed, 4),
                f"{needed:.2%} at {warm} reads a miss ({needed_cold:.2%} if every miss were cold)")

    lifetime = plan.figure("a cached front page's lifetime", PAGE_LIFETIME, "s", "app",
                           "blog/service.py PAGE_LIFETIME")
    misses = max(posted, 1 / lifetime)
    reachable = max(0.0, 1 - misses / views)
    plan.line(f"every post names a new front page (its key holds max_index), so its first view misses: at least "
              f"max({posted:.4g} posts/s, 1 / {lifetime:g} s when no post comes before the page expires) = "
              f"{misses:.4g} misses/s of {views:g} views/s: hit rate at most 1 - {misses:.4g} / {views:g} = "
              f"{reachable:.6f}")
    render, _ = calls_in_turn(plan, AFTER_POST_RPCS, 0, profile, "a miss after a post renders")
    crowd = views * render / 1000
    plan.line(f"views that arrive while that miss renders miss too (the page is added to the cache once rendered): "
              f"{views:g} views/s x {render:.1f} ms = {crowd:.2f} more a post, so the rate reached is lower still")
    crowded = max(0.0, 1 - misses * (1 + crowd) / views)
    fits = reachable >= needed
    plan.answer("hit_rate_reachable", "Front page hit rate the posts allow", round(reachable, 6),
                f"{reachable:.4%} at most ({posts.of('post')}, each a miss; {crowded:.4%} if the {crowd:.1f} views "
                "arriving while it renders miss too): "
                + ("the rate needed fits" if fits else
                   f"the rate needed does not fit; the posts' misses alone read {misses * warm:.4g} reads/s"))

    median, _ = calls_in_turn(plan, figures.TRANSACTION, 0, profile,
                              "a post holds the blog's index entity (its transaction)")
    rate = sustained_rate(plan)
    in_turn = 1000 / median
    plan.line(f"posts take turns on one index entity: at most 1000 / {median:.1f} = {in_turn:.1f} posts/s under the "
              f"model; production's guidance: {rate:g} a second sustained")
    plan.answer("posts_in_turn", "Posts a second one blog takes in turn", rate,
                f"{rate:g} sustained (production's guidance; {in_turn:.1f} at most under the model): "
                + (f"{posts.of('post')} fits" if posted <= rate else f"{posts.of('post')} does not: split the blog"))
    rpcs = sum(figures.TRANSACTION.values())
    plan.answer("post_rpcs", "A post's critical path, RPCs", rpcs, f"{plural(rpcs, 'RPC')} in turn")
    return plan
