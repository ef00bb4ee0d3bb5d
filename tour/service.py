"""The tour: one live figure per lesson, each read the way its lesson teaches (cached totals, gets by key, one query),
and the app's source files, readable in the browser. It knows the lessons only through the features' registry
(core/features.py): it imports no feature."""
import functools
import re

from core.features import REPO


def figures(lessons):
    """{lesson slug: its live figure}; None for a lesson with nothing to show yet (no demo content)."""
    return {slug: lesson.figure() for slug, lesson in lessons.items()}


ENV_KEY = re.compile(r"(\s+[A-Za-z_][A-Za-z0-9_]*:)")


def read_source(path, sources):
    """The text of `path` if it is one of `sources` (the registry's fixed set), else None."""
    return _read(path) if path in sources else None


@functools.cache  # only ever called with one of the registry's sources, so the cache stays as small as that set
def _read(path):
    # Once per process: the deployed files do not change.
    text = (REPO / path).read_text(encoding="utf-8")
    return without_deployment_values(text) if path == "app.yaml" else text


def without_deployment_values(app_yaml):
    """app.yaml as a visitor may read it: each env_variables value replaced by a note. The file in the repo has them
    empty, but a deployment's copy holds its admins' emails and its cache's address."""
    lines, inside = [], False
    for line in app_yaml.splitlines(keepends=True):
        if line.strip() and not line[0].isspace() and not line.startswith("#"):
            inside = line.rstrip() == "env_variables:"
        if inside and line.strip() and not line.lstrip().startswith("#") and line[0].isspace():
            key = ENV_KEY.match(line)
            indent = line[:len(line) - len(line.lstrip())]
            # a key's value, or a line that continues one (a block scalar): neither is shown
            line = f"{key[1]} # (set at deploy; not shown here)\n" if key else f"{indent}#\n"
        lines.append(line)
    return "".join(lines)
