"""`make screenshots`: a PNG of each page under docs/, as the README shows them, and docs/screenshots.json: what each
page showed when it was taken (its cost footer, its "In production today" card, the home page's cards), which
tests/test_html.py compares with today's pages, so that a page changed since fails until they are taken again.

Its own stack (in-memory emulator and memcached, never `make run`'s), seeded with the demo content `make run` seeds,
the app served on loopback, Debian's headless Chromium signed in as an admin; an add_credit job is run first so that
the jobs pages have one to show.
"""
import json
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

from devstack import Stack, serving
from devstack.apps import app_on
from devstack.browser import launch
from devstack.services import backend_from_env
from devstack.serving import wait_until
from main import seed_demo
from planner.service import PLANNERS

DOCS = Path(__file__).resolve().parent.parent / "docs"
ADMIN = "admin@example.com"
WIDTH = 1100
# (file, path, viewport height, full page?, what to wait for). Paths with {job} get the demo job's id.
PAGES = (
    ("home.png", "/", 900, True, ".cards"),
    ("counters.png", "/counters", 900, True, "#counter-likes"),
    ("blog.png", "/blog/demo", 900, False, "article.entry"),
    ("comments.png", "/blog/demo/{newest}?page=last#comments", 900, False, "#comments li.comment"),
    ("jobs.png", "/jobs/{job}", 900, False, "#job"),
    ("accounts.png", "/accounts", 700, False, ".total"),
    ("numbers.png", "/numbers", 1300, False, "table.numbers"),
)
# Pages shown after a form of theirs is sent: the numbers page with a planner's worked example answered (the form's
# defaults), scrolled to the answer as the form's action leaves it.
SENT = {"numbers.png": ('form[data-planner="counter"] button[type="submit"]', '[data-plan="counter"]')}
# Taken from a second app on the same stack under the production latency model (LATENCY=production), where the
# waits the timelines show are production's size: a post's request (its transaction's staircase) and a job's tasks.
TIMELINES = (
    ("request-timeline.png", "/appstats/{post}", 700, True, "[data-timeline] svg"),
    ("job-timeline.png", "/jobs/{job}/timeline", 900, True, "[data-timeline] svg"),
)
PHONE = ("phone.png", "/", 390, 844)
# Each planner's answer to its form's defaults as a phone shows it (docs/plan-<planner>.png): the answer at the top of
# the screen, its figures' table cut at the right edge, where its region scrolls sideways.
PLAN_PHONE = ("plan-{}.png", "/numbers", 360, 800)
MANIFEST = DOCS / "screenshots.json"


def shown(page):
    """What a page shows that its screenshot must show too (tests/test_html.py reads the same from today's HTML)."""
    return {"cost_footer": page.locator("[data-cost]").count() > 0,
            "in_production": page.locator("[data-in-production]").count() > 0,
            "cards": page.locator(".cards > section.card").evaluate_all("cards => cards.map(c => c.id)")}


def _app(stack, tasks_env, **env):
    return app_on(stack, testing=False, **tasks_env, **env, SECRET_KEY="screenshots", ADMIN_EMAILS=ADMIN)


def _signed_in_with_a_job(browser, url):
    """A page of a new browser context on `url`, signed in as the admin, and a finished add_credit job's id."""
    page = browser.new_context(base_url=url, viewport={"width": WIDTH, "height": 900}).new_page()
    page.request.post("/api/session", data={"email": ADMIN, "admin": True})
    job = page.request.post("/api/jobs", data={"name": "add_credit", "params": {"amount": 10}}).json()
    wait_until(lambda: page.request.get(f"/api/jobs/{job['id']}").json()["state"] != "running", "the demo job",
               timeout=300, interval=0.5)
    return page, job["id"]


def _take(page, shots, manifest, **ids):
    for name, path, height, full, ready in shots:
        page.set_viewport_size({"width": WIDTH, "height": height})
        page.goto(path.format(**ids))  # once to fill the caches, as a visitor before
        page.reload()
        page.wait_for_selector(ready)
        if name in SENT:
            button, answered = SENT[name]
            page.click(button)
            page.wait_for_selector(answered)
        page.screenshot(path=DOCS / name, full_page=full)
        manifest[name] = {"path": path, **shown(page)}
        print(f"docs/{name}  {path}", flush=True)


def _take_plans(browser, url):
    name, path, width, height = PLAN_PHONE
    page = browser.new_context(base_url=url, viewport={"width": width, "height": height}, is_mobile=True,
                               has_touch=True, device_scale_factor=2).new_page()
    for planner in PLANNERS:
        page.goto(path)
        page.click(f'form[data-planner="{planner}"] button[type="submit"]')
        answer = page.locator(f'[data-plan="{planner}"]')
        answer.wait_for()
        page.wait_for_load_state("load")  # app.css applied: measured unstyled, the page differs
        answer.evaluate("answer => answer.scrollIntoView()")
        page.screenshot(path=DOCS / name.format(planner))
        print(f"docs/{name.format(planner)}  the {planner} planner's answer at {width} px", flush=True)


def main():
    DOCS.mkdir(exist_ok=True)
    with Stack(consistency=1.0, backend=backend_from_env()) as stack, \
            serving.served(lambda tasks_env: _app(stack, tasks_env)) as (app, url), sync_playwright() as playwright:
        print("Seeding the demo content...", flush=True)
        seed_demo(app)
        browser = launch(playwright)
        page, job = _signed_in_with_a_job(browser, url)
        newest = page.request.get("/api/blogs/demo/entries?limit=1").json()["entries"][0]["index"]
        manifest = {}
        _take(page, PAGES, manifest, job=job, newest=newest)
        with serving.served(lambda tasks_env: _app(stack, tasks_env, LATENCY="production")) as (_, modelled_url):
            print("The timelines, under LATENCY=production...", flush=True)
            modelled, job = _signed_in_with_a_job(browser, modelled_url)
            modelled.request.post("/api/blogs/demo/entries", data={"title": "A post", "body": "Drawn as it ran."})
            post = next(r for r in modelled.request.get("/api/appstats").json()["requests"]
                        if r["method"] == "POST" and r["path"] == "/api/blogs/demo/entries")
            _take(modelled, TIMELINES, manifest, job=job, post=post["id"])
        phone = browser.new_context(base_url=url, viewport={"width": PHONE[2], "height": PHONE[3]}, is_mobile=True,
                                    has_touch=True, device_scale_factor=2)
        phone_page = phone.new_page()
        phone_page.goto(PHONE[1])
        phone_page.screenshot(path=DOCS / PHONE[0])
        print(f"docs/{PHONE[0]}  {PHONE[1]} at {PHONE[2]} px", flush=True)
        _take_plans(browser, url)
        browser.close()
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
