"""The browser tests: the app served over HTTP on loopback (devstack's local Cloud Tasks delivering to it, as under
`make run`), on the session's real emulator and memcached, driven by Playwright in Debian's headless Chromium.

Every page a test opens may only fetch from the app itself (no CDN), must raise no JavaScript error and must break
none of its Content-Security-Policy: all three are checked when the test ends.
"""
from urllib.parse import urlsplit

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import sync_playwright

from core import runtime
from devstack import browser as chromium
from devstack import serving
from devstack.apps import app_on
from main import seed_demo
from tests.support import TEST_ENV, contract_checked

ADMIN = "boss@example.com"  # in ADMIN_EMAILS of the tests' settings

# axe-core as the pinned axe-playwright-python wheel ships it (its axe.min.js, injected into the page: nothing is
# fetched), with the rules of WCAG 2.0 and 2.1 at levels A and AA and axe's best practices (unique landmarks, one main),
# and label-content-name-mismatch (WCAG 2.5.3, level A), which axe 3.48 still tags experimental and leaves out unless
# named: a control's accessible name must contain the text it shows (a "+1" button's too).
AXE = Axe()
AXE_OPTIONS = {"runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]},
               "rules": {"label-content-name-mismatch": {"enabled": True}},
               "resultTypes": ["violations"]}


@pytest.fixture(scope="session")
def browser():
    with sync_playwright() as playwright:
        browser = chromium.launch(playwright)
        yield browser
        browser.close()


@pytest.fixture
def served_app(stack):
    """(app, base URL) of a freshly served app on an empty datastore and cache."""
    fresh = stack.fresh()

    def make_app(tasks_env):
        app = contract_checked(app_on(stack, **TEST_ENV, **tasks_env, **fresh))
        runtime.of(app).cache.flush()
        return app
    with serving.served(make_app) as (app, url):
        yield app, url
    app.extensions["contract"].assert_kept()


@pytest.fixture
def site(served_app):
    """The base URL of a freshly served app on an empty datastore and cache."""
    return served_app[1]


@pytest.fixture
def demo(served_app):
    """The site with the demo content `make run` seeds (each feature's demo.py): its entries' Markdown, its comment
    pages, its grown counters."""
    app, url = served_app
    seed_demo(app)
    return url


class Watched:
    """What the pages of one test fetched and which script errors they raised."""

    def __init__(self, site):
        self.origin = urlsplit(site).netloc
        self.foreign, self.errors = [], []

    def page(self, page):
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        # What the Content-Security-Policy blocks is reported on the console, not raised: it counts as an error too.
        page.on("console", lambda m: m.type == "error" and "Content Security Policy" in m.text
                and self.errors.append(m.text))

    def request(self, request):
        parts = urlsplit(request.url)
        if parts.scheme in ("http", "https", "ws", "wss") and parts.netloc != self.origin:
            self.foreign.append(request.url)


def _context(browser, site, watched, **options):
    context = browser.new_context(base_url=site, **options)
    context.set_default_timeout(15_000)
    context.on("request", watched.request)
    context.on("page", watched.page)
    return context


@pytest.fixture
def watched(site):
    w = Watched(site)
    yield w
    assert not w.foreign, f"pages fetched from outside the app: {w.foreign}"
    assert not w.errors, f"JavaScript errors: {w.errors}"


@pytest.fixture
def page(browser, site, watched):
    """A desktop-sized page in a fresh browser context (no cookies)."""
    context = _context(browser, site, watched, viewport={"width": 1280, "height": 900})
    yield context.new_page()
    context.close()


@pytest.fixture
def new_page(browser, site, watched):
    """new_page(**context options): another page in a browser context of its own (another person, or a phone)."""
    contexts = []

    def make(**options):
        contexts.append(_context(browser, site, watched, **options))
        return contexts[-1].new_page()
    yield make
    for context in contexts:
        context.close()


def sign_in(page, email, admin=False):
    """Through the sign-in form, as a person would; back on the page it started from."""
    start = page.url
    page.get_by_role("link", name="Sign in", exact=True).first.click()
    page.get_by_label("Email").fill(email)
    if admin:
        page.get_by_label("Sign in as an admin").check()
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(start)


def api(page, method, path, data=None):
    """A JSON API call with the page's cookies (its signed-in user); the parsed response, which must be a 2xx."""
    response = page.request.fetch(path, method=method, data=data)
    assert response.ok, f"{method} {path}: {response.status} {response.text()}"
    return response.json() if response.text() else None


def overflow(page):
    """How many pixels the page is wider than its window, once its stylesheet has loaded: after a form's POST the
    new page's text is visible before app.css arrives, and measured unstyled it overflowed (195 px at 360). Call it
    once something only the new page has is seen: before the navigation commits it would measure the old page."""
    page.wait_for_load_state("load")
    return page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")


# A word is broken when the browser lays its letters out on more than one line: the rectangles of the text range that
# holds it then stand at more than one height. ("Commit" in a cell shrunk below its width read "Co / m / mit".)
BROKEN_WORDS = """(root, selector) => {
  const broken = [];
  for (const element of root.querySelectorAll(selector)) {
    const texts = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    for (let text = texts.nextNode(); text; text = texts.nextNode()) {
      for (const word of text.data.matchAll(/[\\p{L}\\p{N}_]+/gu)) {
        const range = document.createRange();
        range.setStart(text, word.index);
        range.setEnd(text, word.index + word[0].length);
        if (new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1) broken.push(word[0]);
      }
    }
  }
  return broken;
}"""


def broken_words(locator, selector="table th, table td"):
    """The words inside `locator`'s elements that match `selector` (by default its tables' cells) which the browser
    broke over two lines or more. A table's cells keep their words whole (a table too wide scrolls in its region)."""
    return locator.evaluate(BROKEN_WORDS, selector)


def accessibility_violations(page):
    """What axe-core finds on the page as it stands: one line per rule broken, with its impact and where."""
    results = AXE.run(page, options=AXE_OPTIONS).response
    # A run of no rules would find nothing too: it must have passed rules (a page of ours passes dozens).
    assert len(results["passes"]) > 10, f"axe-core checked next to nothing on {page.url}"
    found = results["violations"]
    return [f"{v['id']} ({v['impact']}): {v['help']}: " + "; ".join(" ".join(n["target"]) for n in v["nodes"])
            for v in found]
