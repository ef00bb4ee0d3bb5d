"""The reader's budget: what a reader must open to learn each lesson, measured from the README's "Read first" bullets.

Each lesson's bullet reads `- **Read first.** [`a.py`](a.py) (`fn`, `Cls`), then [`b.py`](b.py) ...`: its links are
the lesson's reading path, the first link its first file, and the backticked names in the parentheses right after
the first link are the functions or classes that carry the talk's idea. The budget (issue #54):
- the first file at most FIRST_FILE_MAX lines, each of its named functions or classes ending by line IDEA_BY_LINE;
- each lesson's path (every linked file once) at most PATH_MAX lines, the four lessons' together ALL_PATHS_MAX;
- the first file and the app modules it imports at most LESSON_WITH_IMPORTS_MAX lines (issue #72 item 3): what a
  reader opens to follow the first file's imports. Its imports are read at module level (`import a.b`,
  `from a.b import name`, `from a import b` for a module a/b.py, relative imports), one level deep, each module once,
  whole files; an app module is one in import-linter's root_packages (pyproject.toml). A package's __init__.py is
  counted only when it is what is imported (`import a`, or `from a import name` defined there), not when Python runs
  it on the way to a/b.py. This measure gives the issue's
  figures (counters 358, blog 763, comments 1,203, mapper 1,610) from 2026-11-28 17:13 to 2026-11-29 01:38 (bfa6b92
  to b375cab); following imports transitively gives 2,135 to 3,865.
"""
import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_FILE_MAX = 160
IDEA_BY_LINE = 120
PATH_MAX = 400
ALL_PATHS_MAX = 1500
LESSON_WITH_IMPORTS_MAX = 900
LESSONS = 4  # counters, blog, comments, mapper
APP_PACKAGES = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"])

LESSON_HEADING = re.compile(r"## (Lesson \d+: .*)")
BULLET = "- **Read first.**"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
NAMES_AFTER_LINK = re.compile(r"\s*\(([^)]*)\)")  # "(`fn_a`, `fn_b`)" right after the link
NAME = re.compile(r"`([A-Za-z_][\w.]*)`")


@dataclass
class Lesson:
    heading: str
    path: list[str]  # the linked files, in the bullet's order, each once
    names: list[str]  # what the first file's idea is carried by


def read_first_bullets(readme: Path) -> list[Lesson]:
    """Each "## Lesson" section's "Read first" bullet (its continuation lines included), parsed."""
    lessons: list[Lesson] = []
    heading, bullet = None, None
    for line in [*readme.read_text().splitlines(), ""]:
        if bullet is not None and line.startswith("  ") and not line.lstrip().startswith("- "):
            bullet += " " + line.strip()
            continue
        if bullet is not None:
            lessons.append(_parsed(heading, bullet))
            bullet = None
        if match := LESSON_HEADING.fullmatch(line):
            heading = match.group(1)
        elif line.startswith("#"):
            heading = None
        elif line.startswith(BULLET) and heading is not None:
            bullet = line
    return lessons


def _parsed(heading: str, bullet: str) -> Lesson:
    links = list(LINK.finditer(bullet))
    path = list(dict.fromkeys(link.group(1) for link in links))
    after = NAMES_AFTER_LINK.match(bullet, links[0].end()) if links else None
    return Lesson(heading, path, NAME.findall(after.group(1)) if after else [])


def _lines(file: Path) -> int:
    return len(file.read_text().splitlines())


def _end_line(tree: ast.Module, name: str) -> int | None:
    """The last line of function or class `name` (`Cls.method` for a method), or None when it is not defined."""
    scope: ast.AST = tree
    for part in name.split("."):
        found = next((node for node in ast.walk(scope) if isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == part), None)
        if found is None:
            return None
        scope = found
    return scope.end_lineno


def _module_level(body: list[ast.stmt]):
    """The statements that run when a module is imported: its body's, and those of its top-level if, try and with
    blocks (not those in a function or a class)."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.With):
            yield from _module_level(node.body + getattr(node, "orelse", []))
        elif isinstance(node, ast.Try | ast.TryStar):
            yield from _module_level(node.body + [s for h in node.handlers for s in h.body] + node.orelse
                                     + node.finalbody)


def _module_file(root: Path, dotted: str, packages: tuple[str, ...]) -> str | None:
    """The app file module `dotted` is (a/b.py, else a/b/__init__.py), or None: not an app module, or not a file."""
    parts = dotted.split(".")
    if parts[0] not in packages:
        return None
    return next((f for f in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py") if (root / f).is_file()), None)


def imported_modules(root: Path, file: str, packages: tuple[str, ...] = APP_PACKAGES) -> list[str]:
    """The app modules `file` imports at module level, in the order it imports them, each once (itself never)."""
    package = file.split("/")[:-1]
    found: list[str | None] = []
    for node in _module_level(ast.parse((root / file).read_text()).body):
        if isinstance(node, ast.Import):
            found += [_module_file(root, alias.name, packages) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module.split(".") if node.module else []
            if node.level:
                base = package[:len(package) - node.level + 1] + base
            # `from a import b` imports a/b.py when b is a module (or a/b/__init__.py, a package); else b is a name
            # defined in module a (a.py, or a/__init__.py), as in `from a.b import name`
            found += [_module_file(root, ".".join([*base, alias.name]), packages)
                      or _module_file(root, ".".join(base), packages) for alias in node.names]
    return [m for m in dict.fromkeys(found) if m and m != file]


def with_imports(root: Path, first: str, packages: tuple[str, ...] = APP_PACKAGES) -> dict[str, int]:
    """The first file and the app modules it imports, each with its lines, biggest first."""
    files = [first, *imported_modules(root, first, packages)] if first.endswith(".py") else [first]
    return dict(sorted(((f, _lines(root / f)) for f in files), key=lambda item: -item[1]))


def measured(root: Path, lessons: list[Lesson],
             packages: tuple[str, ...] = APP_PACKAGES) -> tuple[dict[str, dict], list[str]]:
    """Each lesson's figures (first file's lines, where each named function ends, the path's lines, the first file and
    the app modules it imports) and every way the lessons break the budget, as messages (none: within it). The budget
    of the first file with its imports is judged apart, by over_the_imports_budget."""
    figures: dict[str, dict] = {}
    broken: list[str] = []
    if len(lessons) != LESSONS:
        broken.append(f"expected {LESSONS} lessons with a Read first bullet, found {[x.heading for x in lessons]}")
    for lesson in lessons:
        if not lesson.path:
            broken.append(f"{lesson.heading}: its Read first bullet links no file")
            continue
        missing = [p for p in lesson.path if not (root / p).is_file()]
        broken += [f"{lesson.heading}: {p} is linked but is not a file" for p in missing]
        if missing:
            continue
        first = lesson.path[0]
        tree = ast.parse((root / first).read_text()) if first.endswith(".py") else None
        ends = {name: _end_line(tree, name) if tree else None for name in lesson.names}
        figures[lesson.heading] = {"first": first, "first_lines": _lines(root / first), "ends": ends,
                                   "path_lines": sum(_lines(root / p) for p in lesson.path)}
        f = figures[lesson.heading]
        f["with_imports"] = with_imports(root, first, packages)
        f["with_imports_lines"] = sum(f["with_imports"].values())
        if f["first_lines"] > FIRST_FILE_MAX:
            broken.append(f"{lesson.heading}: {first} has {f['first_lines']} lines (at most {FIRST_FILE_MAX})")
        for name, end in ends.items():
            if end is None:
                broken.append(f"{lesson.heading}: `{name}` is named but not defined in {first}")
            elif end > IDEA_BY_LINE:
                broken.append(f"{lesson.heading}: `{name}` ends at line {end} of {first} (by {IDEA_BY_LINE})")
        if f["path_lines"] > PATH_MAX:
            broken.append(f"{lesson.heading}: its path is {f['path_lines']} lines (at most {PATH_MAX}): "
                          + ", ".join(f"{p} {_lines(root / p)}" for p in lesson.path))
    total = sum(f["path_lines"] for f in figures.values())
    if total > ALL_PATHS_MAX:
        broken.append(f"the {len(figures)} lessons' paths are {total} lines together (at most {ALL_PATHS_MAX})")
    return figures, broken


def over_the_imports_budget(figures: dict[str, dict]) -> list[str]:
    """Each lesson whose first file and the app modules it imports pass LESSON_WITH_IMPORTS_MAX lines, with what they
    are made of, biggest first: what there is to cut."""
    return [f"{heading}: {f['first']} and the app modules it imports are {f['with_imports_lines']} lines (at most "
            f"{LESSON_WITH_IMPORTS_MAX}): " + ", ".join(f"{m}: {n}" for m, n in f["with_imports"].items())
            for heading, f in figures.items() if f["with_imports_lines"] > LESSON_WITH_IMPORTS_MAX]


def test_each_lesson_is_read_within_its_budget():
    figures, broken = measured(ROOT, read_first_bullets(ROOT / "README.md"))
    assert not broken, "\n".join(broken)


def test_each_lessons_first_file_with_its_imports_is_read_within_its_budget():
    figures, _ = measured(ROOT, read_first_bullets(ROOT / "README.md"))
    assert len(figures) == LESSONS, f"measured {list(figures)} (test_each_lesson_is_read_within_its_budget says why)"
    broken = over_the_imports_budget(figures)
    assert not broken, "\n".join(broken)


# The app's code: main.py and its packages' .py files, as issue #72 measured them (9,360 lines at b375cab, 2026-11-29
# 01:38; its "no larger than today's" is the target). Issues #71, #73-#76 then added about 725 (10,085 at ba50fdd,
# when #72's refactor began); the refactor took it to 9,752. Then 10 more, a choice: mapper/bulk.py split in two, so
# that lesson 4's reader meets the plain chunks (chunks.py) apart from the increments beyond the talk (increments.py).
# Then 5 more (2026-11-30): the weight's share arithmetic out of TaskPayload.make_children (task.py's `shares`), which
# every cold reader of lesson 4 met on its first read, and why a blog's PostMarker is a root. Then 23 fewer
# (2026-11-30): what nothing needed in key_arithmetic, openapi, features and the planner. Then 7 more, which lesson 4's
# cold readers asked for: a first delivery's unread record named apart from `look` (tree.py `_first_record`), and
# `split`'s slices drawn as the 501-key picture. Then 5 more: a scan's keys without its one more (`chunks.scan_keys`),
# one function where `split` had written the formula again. Then 13 fewer: `_first_record` and `never_committed` gone,
# as a record missing from `look` can only be a first chunk's (the app deletes none). Then 1 more: what "moved on"
# means in `look`, which cold readers had opened delivery.py to find. Then 3 more: a secret's bare name without
# GOOGLE_CLOUD_PROJECT refused saying which setting is missing (it had said the name was no secret's). Then 7 more:
# `TaskRecord.advance` keeps the lesson's fields, and `_kept_up` the weight, lease and timeline beside them, which
# three cold readers of four met in `advance` on their first read. Then 2 fewer: a task's page without its first key,
# which nothing read (mutmut's survivors showed it), and `make_children` without the weight only a test passed. Then
# 12 fewer: no `TaskPage` (and no stored `more`, which only a benchmark read): a task's page is its `page_end`. Then 2
# more: a session key's length checked by one function (`settings.require_long_key`, for SECRET_KEY and Secret Manager's
# key) and the source of "App Engine sets GOOGLE_CLOUD_PROJECT", less a task's returned weight set by no code (a
# computed property, which `advance` and unvisited.py had each set). Then 2 fewer: a counter's attempt count passed
# to the ShardWriter's `write`, not stored on the writer for its answer to read. More code is a choice.
APP_LINES_MAX = 9_740


def app_lines(root: Path) -> int:
    files = [root / "main.py", *(f for package in APP_PACKAGES for f in sorted((root / package).rglob("*.py")))]
    return sum(len(f.read_text().splitlines()) for f in files)


def test_the_apps_code_grows_only_by_a_choice():
    assert app_lines(ROOT) <= APP_LINES_MAX, f"main.py and the app's packages are {app_lines(ROOT)} lines"


# --- the measure itself, on a README of its own ------------------------------------------------------------------

def _fixture(tmp_path, first_body, lessons=LESSONS, names="(`idea`, `Holder.step`)"):
    """A README of `lessons` lessons, each reading lesson{i}/first.py (`first_body`) and then lesson{i}/more.py."""
    sections = []
    for i in range(lessons):
        (tmp_path / f"lesson{i}").mkdir()
        (tmp_path / f"lesson{i}" / "first.py").write_text(first_body)
        (tmp_path / f"lesson{i}" / "more.py").write_text("x = 1\n" * 100)
        sections.append(f"## Lesson {i + 1}: number {i}\n\nIntro.\n\n"
                        f"- **Read first.** [`lesson{i}/first.py`](lesson{i}/first.py) {names}, then\n"
                        f"  [`lesson{i}/more.py`](lesson{i}/more.py) and again [`first`](lesson{i}/first.py).\n"
                        f"- **Headline.** Not a [link](lesson{i}/ignored.py) of the path.\n")
    (tmp_path / "README.md").write_text("# Title\n\n- **Read first.** [`x`](outside.py) outside a lesson\n\n"
                                        + "\n".join(sections) + "## After\n")
    return measured(tmp_path, read_first_bullets(tmp_path / "README.md"))


IDEA = 'def idea():\n    """The talk\'s idea."""\n\n\nclass Holder:\n    def step(self):\n        return 1\n'


def test_the_budget_reads_each_bullets_path_and_names(tmp_path):
    figures, broken = _fixture(tmp_path, IDEA + "# machinery\n" * 100)
    assert broken == []
    assert figures["Lesson 1: number 0"] == {"first": "lesson0/first.py", "first_lines": 107,
                                             "ends": {"idea": 2, "Holder.step": 7}, "path_lines": 207,
                                             "with_imports": {"lesson0/first.py": 107}, "with_imports_lines": 107}
    assert len(figures) == LESSONS


def test_the_budget_says_what_breaks_it(tmp_path):
    late = "\n" * 120 + IDEA + "# machinery\n" * 40  # the idea ends past line 120, the file is 167 lines
    figures, broken = _fixture(tmp_path, late, lessons=3, names="(`idea`, `Holder.step`, `gone`)")
    assert f"expected {LESSONS} lessons with a Read first bullet, found ['Lesson 1: number 0', " \
           "'Lesson 2: number 1', 'Lesson 3: number 2']" in broken
    assert "Lesson 1: number 0: lesson0/first.py has 167 lines (at most 160)" in broken
    assert "Lesson 1: number 0: `idea` ends at line 122 of lesson0/first.py (by 120)" in broken
    assert "Lesson 1: number 0: `Holder.step` ends at line 127 of lesson0/first.py (by 120)" in broken
    assert "Lesson 1: number 0: `gone` is named but not defined in lesson0/first.py" in broken
    (tmp_path / "lesson1" / "more.py").write_text("x = 1\n" * 300)  # 467 lines in lesson 2's path
    (tmp_path / "lesson2" / "more.py").unlink()
    _, broken = measured(tmp_path, read_first_bullets(tmp_path / "README.md"))
    assert "Lesson 2: number 1: its path is 467 lines (at most 400): lesson1/first.py 167, lesson1/more.py 300" \
        in broken
    assert "Lesson 3: number 2: lesson2/more.py is linked but is not a file" in broken


def test_the_four_paths_together_have_a_budget_of_their_own(tmp_path):
    _, broken = _fixture(tmp_path, IDEA + "# machinery\n" * 150)  # 4 x (157 + 100) = 1,028: within
    assert broken == []
    for i in range(LESSONS):
        (tmp_path / f"lesson{i}" / "more.py").write_text("x = 1\n" * 230)  # 4 x (157 + 230) = 1,548
    _, broken = measured(tmp_path, read_first_bullets(tmp_path / "README.md"))
    assert broken == [f"the 4 lessons' paths are 1548 lines together (at most {ALL_PATHS_MAX})"]


IMPORTS = """import os
import shared.util
from google.cloud import ndb
from shared import big, util
from shared.util import helper
from shared import CONSTANT
from . import more
from .more import x
try:
    import shared.optional
except ImportError:
    pass


def late():
    from shared import hidden
"""


def test_the_first_file_is_read_with_the_app_modules_it_imports(tmp_path):
    """Each app module the first file imports at module level is read once, whole: not the library's (os, ndb), not
    those imported in a function (hidden), not what they import in turn (util's deep); a package's __init__.py only
    when a name is imported from it (CONSTANT)."""
    _fixture(tmp_path, IMPORTS + IDEA + "# machinery\n" * 100)
    (tmp_path / "shared").mkdir()
    for name, lines in {"__init__": 3, "big": 500, "util": 20, "optional": 7, "hidden": 900, "deep": 900}.items():
        (tmp_path / "shared" / f"{name}.py").write_text("from shared import deep\n" * lines)
    packages = ("shared", *(f"lesson{i}" for i in range(LESSONS)))
    assert imported_modules(tmp_path, "lesson0/first.py", packages) == [
        "shared/util.py", "shared/big.py", "shared/__init__.py", "lesson0/more.py", "shared/optional.py"]
    figures, broken = measured(tmp_path, read_first_bullets(tmp_path / "README.md"), packages)
    assert broken == []
    assert figures["Lesson 1: number 0"]["with_imports"] == {
        "shared/big.py": 500, "lesson0/first.py": 123, "lesson0/more.py": 100, "shared/util.py": 20,
        "shared/optional.py": 7, "shared/__init__.py": 3}
    assert figures["Lesson 1: number 0"]["with_imports_lines"] == 753
    assert over_the_imports_budget(figures) == []
    assert measured(tmp_path, read_first_bullets(tmp_path / "README.md"))[0]["Lesson 1: number 0"][
        "with_imports_lines"] == 123  # shared and lesson0 are not the app's packages


def test_the_imports_budget_says_what_to_cut(tmp_path):
    _fixture(tmp_path, "from . import more\n" + IDEA + "# machinery\n" * 100)
    (tmp_path / "lesson2" / "more.py").write_text("x = 1\n" * 800)  # lesson 3: 108 + 800 lines
    packages = tuple(f"lesson{i}" for i in range(LESSONS))
    figures, _ = measured(tmp_path, read_first_bullets(tmp_path / "README.md"), packages)
    assert figures["Lesson 1: number 0"]["with_imports_lines"] == 208
    assert over_the_imports_budget(figures) == [
        "Lesson 3: number 2: lesson2/first.py and the app modules it imports are 908 lines (at most 900): "
        "lesson2/more.py: 800, lesson2/first.py: 108"]
