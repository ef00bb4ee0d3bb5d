"""The README and docs/ hold together: every relative link (and image) names a file in the repo, and every #anchor
into a Markdown page names one of its headings, as GitHub renders them."""
import re
import subprocess
from pathlib import Path

from devstack.services import REPO

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _pages():
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    return [REPO / name for name in tracked if name == "README.md" or name.startswith("docs/")]


def _anchor(heading):
    """GitHub's anchor for a heading: lower case, code and link marks dropped, punctuation but - and _ removed,
    spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path):
    return {_anchor(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def test_every_link_in_the_readme_and_docs_leads_somewhere():
    pages = _pages()
    assert REPO / "README.md" in pages and len(pages) > 10
    broken = []
    for page in pages:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto: — outside the repo
                continue
            path, _, anchor = target.partition("#")
            found = (page.parent / path).resolve() if path else page
            if not found.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and found.suffix == ".md" and anchor not in _anchors(found):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_the_anchor_rule_is_githubs():
    assert _anchor("Lesson 1: sharded counters") == "lesson-1-sharded-counters"
    assert _anchor("Where production waits: `LATENCY=production`") == "where-production-waits-latencyproduction"
    assert _anchor("What a request costs: Appstats for today") == "what-a-request-costs-appstats-for-today"
