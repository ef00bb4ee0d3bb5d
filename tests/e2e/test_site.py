"""The site as a whole, in a real browser: signing in and out, the tour, the numbers page, hostile input, phone
widths, labelled controls, axe-core's accessibility rules on every page."""
import pytest
from playwright.sync_api import expect

from blog import demo as blog_demo
from devstack.serving import wait_until
from tests.e2e.conftest import ADMIN, accessibility_violations, api, broken_words, overflow, sign_in

expect.set_options(timeout=15_000)

HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">&amp; "quoted"'

# Every control that has no accessible name: no aria-label, no label, no labelledby, no text, no title.
UNNAMED_CONTROLS = """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea, button')]
  .filter(el => {
    const by = el.getAttribute('aria-labelledby');
    const names = [el.getAttribute('aria-label'), el.title, el.tagName === 'BUTTON' ? el.textContent : '',
                   ...[...(el.labels || [])].map(l => l.textContent), by && document.getElementById(by)?.textContent];
    return !names.some(n => n && n.trim());
  }).map(el => el.outerHTML)"""


def _populate(page):
    """A little of everything, through the API as the signed-in admin; the paths of the pages it made."""
    api(page, "PUT", "/api/counters/likes", {"mode": "adaptive"})
    for _ in range(3):
        api(page, "POST", "/api/counters/likes/increment")
    for i in range(12):
        api(page, "POST", "/api/blogs/demo/entries", {"title": f"Entry {i}", "body": f"Body **{i}**"})
    for n in range(3):
        api(page, "POST", "/api/blogs/demo/entries/11/comments", {"text": f"comment {n}, see https://example.com/{n}"})
    api(page, "POST", "/api/accounts/seed", {"count": 40})
    wait_until(lambda: api(page, "GET", "/api/accounts/summary")["count"] == 40, "40 accounts seeded")
    job = api(page, "POST", "/api/jobs", {"name": "add_credit", "params": {"amount": 1}})
    wait_until(lambda: api(page, "GET", f"/api/jobs/{job['id']}")["state"] == "done", "the job done")
    api(page, "GET", "/api/blogs/demo/entries")
    read = next(r for r in api(page, "GET", "/api/appstats")["requests"] if r["path"] == "/api/blogs/demo/entries")
    return ["/", "/counters", "/blog", "/blog/demo", "/blog/demo?start=1", "/blog/demo/11", "/jobs",
            f"/jobs/{job['id']}", f"/jobs/{job['id']}/timeline", "/accounts", "/numbers", "/signin",
            "/source/counters/service.py", "/appstats", f"/appstats/{read['id']}"]


def test_sign_in_as_admin_then_as_a_user(page):
    page.goto("/counters")
    sign_in(page, ADMIN, admin=True)
    header = page.locator("header.top")
    expect(header).to_contain_text(ADMIN)
    expect(header.locator(".badge")).to_have_text("admin")
    expect(page.get_by_role("heading", name="New counter")).to_be_visible()
    assert api(page, "GET", "/api/session")["user"]["admin"] is True

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/")
    expect(page.get_by_role("link", name="Sign in", exact=True)).to_be_visible()
    assert page.request.get("/api/session").status == 401

    page.goto("/counters")
    sign_in(page, "reader@example.com")
    expect(header).to_contain_text("reader@example.com")
    expect(header.locator(".badge")).to_have_count(0)
    expect(page.get_by_role("heading", name="New counter")).to_have_count(0)
    assert api(page, "GET", "/api/session")["user"]["admin"] is False


def test_the_tour_shows_live_figures_and_leads_to_pages_and_source(page):
    page.goto("/")
    sign_in(page, ADMIN, admin=True)
    _populate(page)
    page.goto("/")
    cards = page.locator(".cards .card")
    expect(cards).to_have_count(5)  # a card per lesson, and one for what each request costs
    expect(page.locator("[data-figure=counters]")).to_have_text("3 likes on 1 shard")
    expect(page.locator("[data-figure=blog]")).to_contain_text("12 entries in demo")
    expect(page.locator("[data-figure=comments]")).to_contain_text("3 comments on the 10 newest entries")
    expect(page.locator("[data-figure=mapper]")).to_contain_text("add_credit done, 40 processed")

    page.locator("#costs").get_by_role("link", name="Appstats").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Appstats: what each request cost")
    expect(page.locator("[data-appstats-table] tr[data-request]").first).to_be_visible()
    page.go_back()
    page.locator("#lesson-counters").get_by_role("link", name="counters/service.py").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("counters/service.py")
    expect(page.locator(".source")).to_contain_text("def increment")
    page.go_back()
    page.locator("#lesson-comments h2 a").click()
    expect(page).to_have_url("/blog/demo/11#comments")
    expect(page.locator("#comments li.comment")).to_have_count(3)
    expect(page.locator("#comments a[href='https://example.com/0']")).to_have_count(1)  # a link, made from text


def test_numbers_are_measured_again_by_an_admin_only(page, new_page):
    page.goto("/numbers")
    expect(page.locator("main")).to_contain_text("Nothing was measured yet")
    expect(page.get_by_role("button", name="Measure again")).to_have_count(0)
    sign_in(page, ADMIN, admin=True)
    page.get_by_role("button", name="Measure again").click()
    rows = page.locator("table.numbers tbody tr")
    expect(rows).to_have_count(6)
    first = [float(t) for t in page.locator("[data-median]").all_text_contents()]
    assert all(m > 0 for m in first)
    expect(page.locator("[data-ratio]")).to_have_text(
        str(api(page, "GET", "/api/numbers")["write_read_ratio"]))
    page.get_by_role("button", name="Measure again").click()
    expect(rows).to_have_count(6)
    assert [float(t) for t in page.locator("[data-median]").all_text_contents()] != first

    reader = new_page()
    reader.goto("/numbers")
    sign_in(reader, "reader@example.com")
    expect(reader.locator("table.numbers tbody tr")).to_have_count(6)
    expect(reader.get_by_role("button", name="Measure again")).to_have_count(0)


@pytest.mark.parametrize("width", [360, 1280])
def test_each_planner_answers_on_the_numbers_page_and_passes_axe(page, width):
    """A visitor sends each planner's form on /numbers: its answer, arithmetic and figures appear under it, the page
    still fits the width, no word of its tables is broken over two lines (they scroll in their region instead), and
    axe-core finds nothing, with each answer shown."""
    page.set_viewport_size({"width": width, "height": 800})
    page.goto("/numbers")
    violations = []
    for name in ("counter", "blog", "comments", "batch", "request"):
        form = page.locator(f'form[data-planner="{name}"]')
        if name == "blog":
            form.get_by_label("Depth of the page read, entries").fill("9990")
        form.get_by_role("button", name="Plan").click()
        answer = page.locator(f'[data-plan="{name}"]')
        expect(answer).to_be_visible()
        expect(answer.locator("ol.arithmetic li").first).to_be_visible()
        if name == "blog":
            expect(answer.locator('[data-answer="offset_reads"]')).to_contain_text("10000 reads")
        wider = overflow(page)
        assert wider <= 0, f"/numbers with the {name} answer is {wider}px wider than {width}px"
        broken = broken_words(answer)
        assert not broken, f"the {name} answer's tables break {len(broken)} words at {width}px: {broken[:10]}"
        assert page.evaluate(UNNAMED_CONTROLS) == [], name
        violations += [f"{name} answer ({width} px): {v}" for v in accessibility_violations(page)]
    assert not violations, "axe-core found:\n" + "\n".join(violations)


def test_a_recorded_request_with_a_long_path_is_planned_within_a_phone(page):
    """The request planner's answer names the recorded request's path, one token of up to 200 characters: at 360 px
    it wraps within the page (the tables' words do not: they scroll)."""
    page.set_viewport_size({"width": 360, "height": 800})
    page.goto("/numbers")
    sign_in(page, ADMIN, admin=True)
    long_path = "/api/counters/" + "a_long_counter_name_" * 5  # 100 characters (the most), nowhere to break
    page.request.get(long_path)
    recorded = next(r for r in api(page, "GET", "/api/appstats")["requests"] if r["path"] == long_path)
    page.reload()
    form = page.locator('form[data-planner="request"]')
    form.locator("select[data-recorded]").select_option(str(recorded["id"]))
    form.get_by_role("button", name="Plan").click()
    answer = page.locator('[data-plan="request"]')
    expect(answer).to_contain_text(long_path)
    wider = overflow(page)
    assert wider <= 0, f"/numbers with a recorded request's long path planned is {wider}px wider than 360px"
    assert not broken_words(answer)


# For each heading of an element, how far it stands below the last button before it (None: no button before it).
GAPS_BELOW_BUTTONS = """card => {
  const buttons = [...card.querySelectorAll('button')];
  return [...card.querySelectorAll('h2, h3')].map(heading => {
    const above = buttons.filter(b => b.compareDocumentPosition(heading) & Node.DOCUMENT_POSITION_FOLLOWING).pop();
    return above ? heading.getBoundingClientRect().top - above.getBoundingClientRect().bottom : null;
  }).filter(gap => gap !== null);
}"""


def test_the_admins_start_forms_span_their_card_and_clear_the_button_above(page):
    """/jobs' start forms set their description across the card (they sat in a column 40% wide) and /accounts' and
    /jobs' headings stand clear of the button above them (they touched it)."""
    page.goto("/jobs")
    sign_in(page, ADMIN, admin=True)
    for path in ("/jobs", "/accounts"):
        page.goto(path)
        card = page.locator("section.card.admin").first
        gaps = card.evaluate(GAPS_BELOW_BUTTONS)
        assert gaps and min(gaps) >= 12, f"{path}: headings {gaps} px below the button above them"
    page.goto("/jobs")
    width = page.locator("section.card.admin").first.bounding_box()["width"]
    for text in page.locator("form[id^=start-] > p").all():
        assert text.bounding_box()["width"] > 0.8 * width, "a start form's description in a narrow column"


def test_a_hostile_title_and_comment_render_as_text(page):
    page.goto("/blog")
    sign_in(page, ADMIN, admin=True)
    page.get_by_label("Blog name").fill("e2e")
    page.get_by_label("Title").fill(HOSTILE)
    page.get_by_label("Body (Markdown)").fill("<script>window.pwned = 3</script>plain body")
    page.get_by_role("button", name="Post").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(HOSTILE)
    page.get_by_label("Your comment").fill(HOSTILE)
    page.get_by_role("button", name="Comment").click()
    expect(page.locator("#comments li.comment .text")).to_have_text(HOSTILE)
    for path in ("/blog/e2e", "/blog/e2e/0", "/blog"):
        page.goto(path)
        if path == "/blog/e2e":
            expect(page.locator("article.entry h2")).to_have_text(HOSTILE)
        assert page.evaluate("window.pwned") is None, path
        assert page.locator("img[src=x]").count() == 0, path
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto("/blog/e2e/0")
    assert page.evaluate("window.pwned") is None and not dialogs


@pytest.mark.parametrize("width", [360, 1280])
def test_every_page_fits_the_width_names_its_controls_and_passes_axe(page, new_page, width):
    """Every page an admin reaches, at a phone's width and a desktop's, breaking no word of a table or of code over
    two lines. axe-core (WCAG 2.1 A and AA, best practices)
    runs once per page and person: on the admin's pages at 360 px, where tables and code scroll sideways, and on
    the visitor's at 1,280 px, error pages included (an admin's page refused, an unknown blog)."""
    page.goto("/")
    sign_in(page, ADMIN, admin=True)
    paths = _populate(page)
    api(page, "POST", "/api/numbers")
    phone = new_page(viewport={"width": width, "height": 800}, is_mobile=width < 600, has_touch=width < 600)
    phone.goto("/")
    sign_in(phone, ADMIN, admin=True)
    violations = []
    for path in paths:
        response = phone.goto(path)
        assert response.ok, path
        wider = overflow(phone)
        assert wider <= 0, f"{path} is {wider}px wider than a {width}px screen"
        # a name in code moves to the next line whole ("audit_a / ccounts" was broken by word-break: break-all)
        broken = broken_words(phone.locator("body"), "table th, table td, code")
        assert not broken, f"{path} breaks words of its tables or code at {width}px: {broken[:10]}"
        assert phone.evaluate(UNNAMED_CONTROLS) == [], path
        expect(phone.get_by_role("navigation", name="Main")).to_be_visible()
        if width < 600:
            violations += [f"{path} (admin, {width} px): {v}" for v in accessibility_violations(phone)]
    if width >= 600:
        visitor = new_page(viewport={"width": width, "height": 800})
        for path in [*paths, "/blog/no-such-blog"]:
            visitor.goto(path)
            violations += [f"{path} (visitor, {width} px): {v}" for v in accessibility_violations(visitor)]
    assert not violations, "axe-core found:\n" + "\n".join(violations)


def _demo_paths(page):
    """Every kind of page over the seeded demo, as the signed-in admin `page` finds them: the blog's pages and its
    deepest, the top entry's comment pages both ways (?after, then ?before back), a finished job, a request's
    timeline, an error page."""
    page.goto(f"/blog/demo/{blog_demo.DEMO_ENTRIES - 1}")
    after = page.locator("#comments nav a[rel=next]").first.get_attribute("href").split("#")[0]
    page.goto(after)
    before = page.locator("#comments nav a[rel=prev]").first.get_attribute("href").split("#")[0]
    assert "?after=" in after and "?before=" in before
    job = api(page, "POST", "/api/jobs", {"name": "add_credit", "params": {"amount": 1}})
    wait_until(lambda: api(page, "GET", f"/api/jobs/{job['id']}")["state"] == "done", "the job done", timeout=60)
    api(page, "POST", "/api/numbers")
    read = next(r for r in api(page, "GET", "/api/appstats")["requests"] if r["path"] == "/api/numbers")
    top = blog_demo.DEMO_ENTRIES - 1
    return ["/", "/counters", "/blog", "/blog/demo", f"/blog/demo?start={top - 10}", f"/blog/demo/{top}", after,
            before, "/blog/demo/0", "/jobs", f"/jobs/{job['id']}", f"/jobs/{job['id']}/timeline", "/accounts",
            "/numbers", "/signin", "/source/counters/service.py", "/appstats", f"/appstats/{read['id']}",
            "/blog/no-such-blog"]


@pytest.mark.parametrize("width", [360, 1280])
def test_the_seeded_demo_passes_axe_as_visitor_and_admin(demo, page, new_page, width):
    """The content a newcomer sees first (`make run`'s seeds: Markdown with code blocks, 45 comments on an entry, grown
    counters), every kind of page, for an admin and for a visitor, at a phone's width and a desktop's: axe-core's
    WCAG 2.1 A and AA rules and best practices find nothing, and no page is wider than the screen."""
    page.goto("/")
    sign_in(page, ADMIN, admin=True)
    paths = _demo_paths(page)
    phone = width < 600
    admin = new_page(viewport={"width": width, "height": 800}, is_mobile=phone, has_touch=phone)
    admin.goto("/")
    sign_in(admin, ADMIN, admin=True)
    visitor = new_page(viewport={"width": width, "height": 800}, is_mobile=phone, has_touch=phone)
    violations, checked = [], 0
    for who, person in (("admin", admin), ("visitor", visitor)):
        for path in paths:
            person.goto(path)
            wider = overflow(person)
            assert wider <= 0, f"{path} ({who}) is {wider}px wider than a {width}px screen"
            violations += [f"{path} ({who}, {width} px): {v}" for v in accessibility_violations(person)]
            checked += 1
    # The seeded entries do hold code blocks (the Markdown's <pre>, which scrolled sideways at 360 px before).
    admin.goto("/blog/demo")
    assert admin.locator("article.entry pre").count() > 0
    assert checked == 2 * len(paths)
    assert not violations, "axe-core found:\n" + "\n".join(violations)
