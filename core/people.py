"""A signed-in person as the pages show them to others (core/identity.py signs them in): never their email, never
their account id."""
import hashlib
import hmac
from typing import TypedDict

from core import runtime


class User(TypedDict):
    """A signed-in person as the session, the pages and the API carry them."""
    id: str  # stable (Google's `sub`, or derived from the dev sign-in's email); never contains "|"
    email: str
    admin: bool


def pseudonym(user: User) -> str:
    """The user's id where others can see it (in a comment's id): keyed by the app's secret, so nobody can tell whose
    it is from an email (the dev id is a plain hash of one) or from Google's `sub` (a Google account id). Stable while
    SECRET_KEY is: rotating it starts a user's new comments in a new group; old ones keep their ids."""
    secret = runtime.current().settings.secret_key.encode()
    return "u" + hmac.new(secret, b"pseudonym\0" + user["id"].encode(), hashlib.sha256).hexdigest()[:24]


def display_name(email: str) -> str:
    """What a page shows of a person: the part of the email before the '@', never the address itself: anyone can read
    the pages, and an address is a way in for phishing and a key to the admins' accounts (ADMIN_EMAILS)."""
    return email.split("@", 1)[0]
