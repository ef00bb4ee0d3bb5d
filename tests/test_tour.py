"""The home page's tour (live figures per lesson), the source viewer and the navigation every page shares."""
import re

import pytest

from core import features
from tests.support import csrf_token


def _figure(html, lesson):
    match = re.search(rf'data-figure="{lesson}">(.*?)</p>', html, re.S)
    assert match, f"no figure for {lesson}"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", match.group(1))).strip()


def test_empty_datastore_tour_says_there_is_nothing_yet(app, client):
    html = client.get("/").get_data(as_text=True)
    assert _figure(html, "counters") == "No demo counter yet."
    assert _figure(html, "blog") == "No demo blog yet."
    assert _figure(html, "comments") == "No comments yet."
    assert _figure(html, "mapper") == "No job has run yet."
    for lesson in features.of(app).lesson_index.values():
        assert lesson.title in html
        for path in lesson.sources:
            assert f'href="/source/{path}"' in html


def test_figures_follow_what_happens(client, auth, task_queue):
    auth.admin()
    assert client.put("/api/counters/likes", json={"mode": "adaptive"}).status_code == 200
    for _ in range(3):
        client.post("/api/counters/likes/increment")
    for i in range(12):
        assert client.post("/api/blogs/demo/entries", json={"title": f"t{i}", "body": "b"}).status_code == 201
    for index, count in ((11, 2), (5, 1), (0, 4)):  # index 0 is not on the front page: not counted
        for n in range(count):
            r = client.post(f"/api/blogs/demo/entries/{index}/comments", json={"text": f"c{n}"})
            assert r.status_code == 201
    assert client.post("/api/accounts/seed", json={"count": 30}).status_code == 202
    task_queue.drain()
    job = client.post("/api/jobs", json={"name": "add_credit", "params": {"amount": 2}}).get_json()
    task_queue.drain()

    html = client.get("/").get_data(as_text=True)
    assert _figure(html, "counters") == "3 likes on 1 shard"
    assert _figure(html, "blog") == "12 entries in demo"
    assert _figure(html, "comments") == "3 comments on the 10 newest entries, 2 on the busiest"
    assert _figure(html, "mapper") == "Last job: add_credit done, 30 processed by 1 task"
    assert f'href="/jobs/{job["id"]}"' in html
    assert 'href="/blog/demo/11#comments"' in html  # the comments card leads to the busiest entry

    client.post("/api/counters/likes/increment")
    assert _figure(client.get("/").get_data(as_text=True), "counters") == "4 likes on 1 shard"


def test_source_viewer_shows_listed_files_escaped(client):
    r = client.get("/source/counters/service.py")
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and "def increment" in html and 'id="L1"' in html
    # Python's "<" and quotes arrive as text, never as markup
    assert "&lt;" in html and "<= " not in html.split("<pre>")[1]


@pytest.mark.parametrize("path", ["../main.py", "counters/../main.py", ".devstack/secret_key", "tests/conftest.py",
                                  "counters/__init__.py", "/etc/passwd", "core/views.pyc", "secret.yaml"])
def test_source_viewer_refuses_anything_else(client, path):
    r = client.get(f"/source/{path}", follow_redirects=True)  # "//etc" is first merged to "/etc" (308)
    assert r.status_code == 404 and "root:" not in r.get_data(as_text=True)


def test_every_page_has_the_same_navigation_and_sign_in(client, auth):
    pages = ["/", "/counters", "/blog", "/jobs", "/accounts", "/numbers", "/signin", "/source/main.py"]
    links = ['href="/counters"', 'href="/blog"', 'href="/jobs"', 'href="/accounts"', 'href="/numbers"']
    for path in pages:
        html = client.get(path).get_data(as_text=True)
        assert all(link in html for link in links), path
        assert 'href="/signin?next=' in html, path
        assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    auth.sign_in("reader@example.com")
    for path in pages:
        html = client.get(path).get_data(as_text=True)
        assert "reader@example.com" in html and "Sign out" in html, path
    html = client.get("/jobs").get_data(as_text=True)
    assert re.search(r'href="/jobs" aria-current="page"', html) and 'href="/counters" aria-current' not in html


def test_sign_out_from_the_header_leads_home(client, auth):
    auth.sign_in()
    r = client.post("/signout", data={"csrf_token": csrf_token(client, "/numbers")})
    assert r.status_code == 302 and r.headers["Location"] == "/"
    assert client.get("/api/session").status_code == 401


def test_each_lesson_page_links_to_its_source(client, auth):
    auth.admin()
    assert client.post("/api/blogs/demo/entries", json={"title": "t", "body": "b"}).status_code == 201
    for page, path in (("/counters", "counters/simple.py"), ("/counters", "counters/service.py"),
                       ("/blog/demo", "blog/service.py"),
                       ("/blog/demo/0", "comments/service.py"), ("/jobs", "mapper/tree.py"),
                       ("/jobs", "mapper/keyrange.py"), ("/accounts", "accounts/service.py"),
                       ("/numbers", "latency/service.py")):
        assert f'href="/source/{path}"' in client.get(page).get_data(as_text=True), page
        assert client.get(f"/source/{path}").status_code == 200


def test_each_lesson_says_how_production_differs_today_on_its_page_and_in_the_readme(app, client, auth):
    """Every lesson has an "In production today" part: each caveat on the lesson's page with its source link, and
    the same source cited in the README's section for that lesson."""
    auth.admin()
    assert client.post("/api/blogs/demo/entries", json={"title": "t", "body": "b"}).status_code == 201
    readme = (features.REPO / "README.md").read_text()
    sections = dict(re.findall(r"\n## (Lesson \d)[^\n]*\n(.*?)(?=\n## )", readme, re.S))
    pages = {"counters": ("/counters", "Lesson 1"), "blog": ("/blog/demo", "Lesson 2"),
             "comments": ("/blog/demo/0", "Lesson 3"), "mapper": ("/jobs", "Lesson 4")}
    lessons = features.of(app).lesson_index
    assert set(lessons) == set(pages)
    for slug, (page, section) in pages.items():
        caveats = lessons[slug].caveats
        assert caveats, slug
        html = client.get(page).get_data(as_text=True)
        shown = re.search(r'<section class="card" data-in-production.*?</section>', html, re.S)
        assert shown, page
        assert shown[0].count("data-caveat") == len(caveats), page
        # The README's Markdown code spans are code on the page, never raw backticks.
        assert "`" not in shown[0], page
        spans = sum((c.fact + c.app).count("`") for c in caveats) // 2
        assert shown[0].count("<code>") == spans, page
        part = sections[section].partition("### In production today")[2]
        assert part, f"README {section} has no 'In production today' part"
        for caveat in caveats:
            assert f'href="{caveat.source}"' in shown[0], (page, caveat.source)
            assert caveat.source in part, (section, caveat.source)


SECRETS = ("sekrit-42", "boss@corp.example", "old@corp.example", "10.0.0.3")
# A deployment's app.yaml, spelled every way gcloud's YAML parser reads the same env_variables.
SPELLINGS = {
    "block": [('ADMIN_EMAILS: ""', 'ADMIN_EMAILS: "boss@corp.example"'),
              ('REDIS_URL: ""', "REDIS_URL: |\n    redis://10.0.0.3:6379/0#x")],
    "comment after the key": [("env_variables:\n", "env_variables:  # the deployment's\n"),
                              ('ADMIN_EMAILS: ""', 'ADMIN_EMAILS: "boss@corp.example"  # was "old@corp.example"')],
    "flow": [("env_variables:\n", "env_variables: {SECRET_KEY: sekrit-42, 'REDIS_URL': \"redis://10.0.0.3\"}\nx:\n")],
    "quoted key": [("env_variables:\n", '"env_variables":\n'), ('GOOGLE_CLIENT_ID: ""', "SECRET_KEY: 'sekrit-42'")],
    "commented out": [('GOOGLE_CLIENT_ID: ""', 'GOOGLE_CLIENT_ID: ""\n  # SECRET_KEY: sekrit-42')],
    "merge key": [("runtime:", "x-base: &base {SECRET_KEY: sekrit-42}\nruntime:"),
                  ("env_variables:\n", "env_variables:\n  <<: *base\n")],
    "alias": [("runtime:", "x-secret: &secret sekrit-42\nruntime:"),
              ("env_variables:\n", "env_variables:\n  SECRET_KEY: *secret\n")],
}


@pytest.fixture
def deployed_app_yaml(tmp_path, monkeypatch):
    """write(text): /source/app.yaml reads `text` as a deployment's app.yaml (the repo's other files as they are)."""
    from tour import service as tour

    def write(text):
        (tmp_path / "app.yaml").write_text(text)
        tour._read.cache_clear()
    monkeypatch.setattr(tour, "REPO", tmp_path)
    yield write
    tour._read.cache_clear()


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_app_yaml_is_shown_without_a_deployments_values(client, deployed_app_yaml, spelling):
    """A deployment's app.yaml holds its admins' emails and its cache's address, perhaps SECRET_KEY (with which anyone
    could forge an admin's session): /source/app.yaml shows its keys and comments, never a value under env_variables,
    however the YAML spells it."""
    deployed = (features.REPO / "app.yaml").read_text()
    for old, new in SPELLINGS[spelling]:
        assert old in deployed
        deployed = deployed.replace(old, new, 1)
    deployed_app_yaml(deployed)
    r = client.get("/source/app.yaml")
    page = r.get_data(as_text=True)
    assert r.status_code == 200 and "entrypoint: gunicorn" in page
    assert not [secret for secret in SECRETS if secret in page]
    assert "(set at deploy; not shown here)" in page
    from tour import service as tour
    shown = tour.without_deployment_values(deployed)
    assert shown.count("\n") == deployed.count("\n")  # line for line: nothing else moved
    assert "# Comma-separated emails that are admins" in shown  # the comments that document the settings stay


def test_app_yaml_that_does_not_parse_is_not_shown(client, deployed_app_yaml):
    deployed_app_yaml((features.REPO / "app.yaml").read_text() + "---\nenv_variables: {SECRET_KEY: sekrit-42}\n")
    r = client.get("/source/app.yaml")
    assert r.status_code == 404 and "sekrit-42" not in r.get_data(as_text=True)


def test_the_repos_app_yaml_is_shown(client):
    page = client.get("/source/app.yaml").get_data(as_text=True)
    assert "ADMIN_EMAILS: &#34;(set at deploy; not shown here)&#34;" in page and "entrypoint: gunicorn" in page
