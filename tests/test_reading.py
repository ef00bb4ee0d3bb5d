"""The reader's budget: what a reader must open to learn each lesson, measured from the README's "Read first" bullets.

Each lesson's bullet reads `- **Read first.** [`a.py`](a.py) (`fn`, `Cls`), then [`b.py`](b.py) ...`: its links are
the lesson's reading path, the first link its first file, and the backticked names in the parentheses right after
the first link are the functions or classes that carry the talk's idea. The budget (issue #54):
- the first file at most FIRST_FILE_MAX lines, each of its named functions or classes ending by line IDEA_BY_LINE;
- each lesson's path (every linked file once) at most PATH_MAX lines, the four lessons' together ALL_PATHS_MAX.
"""
import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_FILE_MAX = 160
IDEA_BY_LINE = 120
PATH_MAX = 400
ALL_PATHS_MAX = 1500
LESSONS = 4  # counters, blog, comments, mapper

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


def measured(root: Path, lessons: list[Lesson]) -> tuple[dict[str, dict], list[str]]:
    """Each lesson's figures (first file's lines, where each named function ends, the path's lines) and every way the
    lessons break the budget, as messages (none: within it)."""
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


def test_each_lesson_is_read_within_its_budget():
    figures, broken = measured(ROOT, read_first_bullets(ROOT / "README.md"))
    assert not broken, "\n".join(broken)


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
                                             "ends": {"idea": 2, "Holder.step": 7}, "path_lines": 207}
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
