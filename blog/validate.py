"""What the blog accepts from a URL, a form or a JSON body: each check is a 400 or a 422 naming its field."""
import re

from core import validate
from core.errors import BadInput, Unprocessable

NAME_PATTERN = re.compile(r"[a-z0-9-]{1,64}")
TITLE_MAX = 200
BODY_MAX = 100_000
MAX_INDEX = 10 ** 9  # bounds `start` and permalinks; far beyond any blog's entries


def validate_blog(name: object) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise BadInput("A blog name is 1 to 64 characters of lowercase letters, digits and '-'.", "bad_blog")
    return name


def validate_index(value: object, field: str = "index") -> int:
    return validate.whole_number(value, field, 0, MAX_INDEX)


def validate_title(value: object) -> str:
    title = validate.text(value, "title", TITLE_MAX, strip=True)
    if "\n" in title or "\r" in title:
        raise Unprocessable("title must be one line.", "bad_title")
    return title


def validate_body(value: object) -> str:
    return validate.text(value, "body", BODY_MAX)

