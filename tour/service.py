"""The tour: one live figure per lesson, each read the way its lesson teaches (cached totals, gets by key, one query),
and the app's source files, readable in the browser. It knows the lessons only through the features' registry
(core/features.py): it imports no feature."""
import functools
import re
from collections.abc import Iterator
from typing import cast

import yaml

from core.features import REPO


def read_source(path: str, sources: frozenset[str]) -> str | None:
    """The text of `path` if it is one of `sources` (the registry's fixed set), else None."""
    return _read(path) if path in sources else None


@functools.cache  # only ever called with one of the registry's sources, so the cache stays as small as that set
def _read(path: str) -> str | None:
    # Once per process: the deployed files do not change.
    text = (REPO / path).read_text(encoding="utf-8")
    return without_deployment_values(text) if path == "app.yaml" else text


HIDDEN = "(set at deploy; not shown here)"
# A commented-out setting under env_variables (`# SECRET_KEY: old-value`): its value is hidden like a live one's.
COMMENTED_VALUE = re.compile(r"(?P<key>#\s*[\"']?[A-Z][A-Z0-9_]*[\"']?\s*:)\s*\S.*")
# What may stand before a scalar's text in its span: an anchor and a tag, kept so that an alias to it still parses.
NODE_PROPERTIES = re.compile(r"(?:[&!]\S*\s+)*")


def without_deployment_values(app_yaml: str) -> str | None:
    """app.yaml as a visitor may read it: every value under env_variables replaced by a note, or None when that cannot
    be done surely. A deployment's copy may hold its SECRET_KEY: so the file is parsed as gcloud parses it, and each
    value is found where the parser read it, however the YAML spells it (flow style, a block scalar, a merge key...)."""
    try:
        root = yaml.compose(app_yaml, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    spans = sorted({span for env in _env_values(root) for span in _value_spans(env)}, reverse=True)
    text = app_yaml
    for start, end in spans:  # from the end, so the earlier spans' places stay where the parser found them
        value = text[start:end]
        properties = cast(re.Match[str], NODE_PROPERTIES.match(value))[0]  # it matches every text, if only ""
        text = text[:start] + properties + f'"{HIDDEN}"' + "\n" * value.count("\n") + text[end:]
    lines = text.splitlines(keepends=True)
    for env in _env_values(root):  # its lines, with the comments among and after its entries
        last = env.end_mark.line + (env.end_mark.column > 0)
        for n in range(env.start_mark.line, min(last, len(lines))):
            at = _comment_at(lines[n])
            if at is None:
                continue
            code, comment = lines[n][:at], lines[n][at:].rstrip("\n")
            # A comment after a value (`KEY: "x"  # was "y"`) goes; a line of comment stays, but for the value of a
            # setting it holds (`# SECRET_KEY: old-value`).
            kept = code.rstrip() if code.strip() else code + COMMENTED_VALUE.sub(rf"\g<key> {HIDDEN}", comment)
            lines[n] = kept + "\n"
    shown = "".join(lines)
    return shown if _all_hidden(shown) else None


def _env_values(root: yaml.Node | None) -> Iterator[yaml.Node]:
    """The value nodes of every env_variables at the top of `root`."""
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if isinstance(key, yaml.ScalarNode) and key.value == "env_variables":
                yield value


def _value_spans(node: yaml.Node, seen: set[int] | None = None) -> Iterator[tuple[int, int]]:
    """(start, end) in the text of each value of the mapping `node` (and of the mappings it merges with `<<`); the whole
    node when it is not a mapping."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:merge":
                for merged in value.value if isinstance(value, yaml.SequenceNode) else [value]:
                    yield from _value_spans(merged, seen)
            else:
                yield from _value_spans(value, seen)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _value_spans(item, seen)
    else:
        yield node.start_mark.index, node.end_mark.index


def _comment_at(line: str) -> int | None:
    """Where the YAML comment on `line` starts (a '#' at its start or after a space, outside quotes), or None."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'" and (i == 0 or line[i - 1] in " \t{[,:"):
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] in " \t"):
            return i
    return None


def _all_hidden(shown: str) -> bool:
    """Whether every value under env_variables in `shown` is the note (a check of the result, parsed again)."""
    try:
        root = yaml.compose(shown, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return False
    return all(shown[start:end].endswith(f'"{HIDDEN}"') for env in _env_values(root)
               for start, end in _value_spans(env))
