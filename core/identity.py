"""Who is asking: the dev sign-in locally, Sign in with Google wherever GOOGLE_CLIENT_ID is set (App Engine), kept in
the signed session cookie either way. Anyone reads; writing needs a signed-in person; admins are ADMIN_EMAILS. A
session ends SESSION_HOURS after the sign-in, and signing out ends every copy of the cookie (docs/security.md). Why not
Identity-Aware Proxy: its policy covers a whole service, not a path (docs/deploy.md, "Sign-in").
"""
import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from typing import Any

import requests
from flask import g, session
from google.auth import exceptions as auth_exceptions
from google.auth import jwt
from google.cloud import ndb

from core import people, runtime, validate
from core.errors import AppError, Forbidden, NotFound, SignInRequired, Unavailable, Unprocessable

log = logging.getLogger(__name__)
# Google's ID-token keys (google-auth's verify_oauth2_token fetches them on every call; here once an hour).
GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
GOOGLE_ISSUERS = ("accounts.google.com", "https://accounts.google.com")
SESSION_HOURS = 12  # a sign-in lasts this long from the moment it was made, however the cookie is used or re-issued
# Seconds a session generation stays in the cache: if the cache was unreachable at sign-out and comes back still
# holding the old value (a frozen server, not a restarted one), a revoked copy can pass for at most this long.
GENERATION_LIFETIME = 600
NEVER_SIGNED_OUT = "0"  # the generation of a person who never signed out (no entity)
GENERATION_CLAIM = b"lease:"  # a reader's claim (`generation`), not hex; the bytes earlier versions write and expect
GENERATION_CLAIM_SECONDS = 10  # a reader that dies holding one leaves the others reading Datastore for this long


EMAIL_PATTERN = re.compile(r"[^@\s|<>\"']{1,64}@[A-Za-z0-9.-]{1,189}\.[A-Za-z]{2,24}")


class GoogleKeys:
    """Google's public keys for its ID tokens, refreshed hourly, one fetch at a time. When a refresh fails, the keys
    held stay in use (Google announces new ones well before use); with none, a failed fetch answers every caller for
    `retry_after` seconds instead of each waiting out its own timeout in turn."""

    def __init__(self, url: str = GOOGLE_CERTS_URL, lifetime: float = 3600, timeout: float = 5,
                 retry_after: float = 30) -> None:
        self.url, self.lifetime, self.timeout, self.retry_after = url, lifetime, timeout, retry_after
        self._keys: dict[str, str] | None = None
        self._due = 0.0  # monotonic time of the next fetch
        self._failure: Exception | None = None  # the last fetch's error, while no keys are held
        self._lock = threading.Lock()

    def get(self) -> dict[str, str]:
        keys = self._keys
        if keys is not None and time.monotonic() < self._due:
            return keys
        with self._lock:
            keys, now = self._keys, time.monotonic()
            if now < self._due:  # another thread fetched (or failed) while this one waited
                if keys is None:
                    raise requests.ConnectionError(f"Google's keys unavailable: {self._failure!r}")
                return keys
            try:
                response = requests.get(self.url, timeout=self.timeout)
                response.raise_for_status()
                fetched = response.json()
                if not isinstance(fetched, dict) or not fetched:
                    raise ValueError("Google's keys: not a JSON object of keys")
            except (requests.RequestException, ValueError) as e:
                self._due, self._failure = time.monotonic() + self.retry_after, e
                if keys is None:
                    raise
                log.warning("Google's keys not refreshed, the held ones stay in use: %r", e)
                return keys
            self._keys, self._due, self._failure = fetched, time.monotonic() + self.lifetime, None
            return fetched


def verify_google_id_token(token: object, client_id: str, keys: GoogleKeys) -> dict[str, Any] | None:
    """The claims of a verified Google ID token, or None when the token is forged, expired, for another app (`aud`),
    from another issuer, or for an address Google has not verified."""
    if not isinstance(token, str) or not token or len(token) > 4096:
        return None
    try:
        certs = keys.get()
    except (requests.RequestException, ValueError) as e:
        raise Unavailable("Sign-in cannot be checked right now; try again shortly.", "google_keys_unavailable") from e
    try:
        # The signature (RS256 or ES256 only: google-auth refuses "none" and HS256), `aud`, and `iat`/`exp` with 10 s
        # of leeway for a clock a little behind Google's.
        claims = jwt.decode(token, certs=certs, audience=client_id, clock_skew_in_seconds=10)
    except (ValueError, auth_exceptions.GoogleAuthError):
        return None
    if (claims.get("iss") not in GOOGLE_ISSUERS or not claims.get("sub") or not isinstance(claims.get("email"), str)
            or claims.get("email_verified") is not True):
        return None
    return claims


def email_is_the_accounts(claims: dict[str, Any]) -> bool:
    """Whether Google vouches that the email is the account's own: Gmail, a service account, or a Workspace account of
    the address's domain (`hd`, https://developers.google.com/identity/gsi/web/guides/verify-google-id-token). Only
    such an address counts as an admin: someone who left a company keeps a Google account made on its address."""
    domain = claims["email"].lower().rpartition("@")[2]
    return domain == "gmail.com" or domain.endswith(".gserviceaccount.com") or claims.get("hd", "").lower() == domain


def make_user(user_id: str, email: str, admin: bool) -> people.User:
    email = email.lower()
    # Ids go into composite keys joined by '|' (comments): they must never contain it.
    return {"id": user_id.replace("|", ":"), "email": email, "admin": bool(admin)}


def dev_user_id(email: str) -> str:
    return "dev-" + hashlib.sha256(email.lower().encode()).hexdigest()[:20]


class SessionGeneration(ndb.Model):
    """A person's session generation, keyed by user id; signing out changes it. A random token, so sign-out writes it
    blind (no transaction). Cached by hand, not by ndb's global cache, which keeps no misses: most people never sign
    out, so have no entity."""
    _use_global_cache = False
    value = ndb.TextProperty()  # not indexed: never queried


def _generation_key(user_id: str) -> str:
    return "session-generation:" + hashlib.sha256(user_id.encode()).hexdigest()[:32]


def generation(user_id: str) -> str:
    """The person's session generation: from the cache, else read by key and cached. A read from before a sign-out
    must never be stored after it: the reader that misses takes a claim first (`add`, Facebook's memcache "leases":
    docs/security.md), reads, and stores its read only while its claim is still there (`replace_if`)."""
    cache, key = runtime.cache(), _generation_key(user_id)
    cached = cache.get(key)
    if cached is not None and not cached.startswith(GENERATION_CLAIM):
        return cached.decode()
    claim = GENERATION_CLAIM + secrets.token_hex(8).encode()
    claimed = cached is None and cache.add(key, claim, expire=GENERATION_CLAIM_SECONDS) is True
    found = SessionGeneration.get_by_id(user_id)
    value = found.value if found is not None else NEVER_SIGNED_OUT
    if claimed:
        cache.replace_if(key, claim, value, expire=GENERATION_LIFETIME)
    return value


def _renew_generation(user_id: str) -> None:
    """Sign-out: a new generation, written to Datastore first (the truth), then stored over the cached one: a store,
    not a delete, so that it replaces any reader's claim too (`generation`)."""
    value = secrets.token_hex(8)
    SessionGeneration(id=user_id, value=value).put()
    runtime.cache().set(_generation_key(user_id), value, expire=GENERATION_LIFETIME)


def _session_is_current(user: people.User) -> bool:
    """Whether this cookie's sign-in is still good: made less than SESSION_HOURS ago by the sign-in's time it carries
    (Flask's own age check counts from the last re-issue), and of the person's current session generation."""
    signed_in, carried = session.get("signed_in"), session.get("generation")
    if not isinstance(signed_in, int) or isinstance(signed_in, bool) or not isinstance(carried, str):
        return False  # a cookie from before sessions carried them, or not one this app made
    age = time.time() - signed_in
    return -60 <= age < SESSION_HOURS * 3600 and hmac.compare_digest(carried, generation(user["id"]))


def current_user() -> people.User | None:
    """The signed-in user for this request, or None (a cookie whose sign-in has ended is cleared)."""
    if "user" not in g:
        settings = runtime.current().settings
        user = session.get("user")
        if user is not None and not _session_is_current(user):
            session.clear()
            user = None
        if user is not None:
            if user["id"].startswith("dev-"):  # a dev sign-in's cookie counts only where the dev sign-in exists
                user = user if settings.dev_signin else None
            else:
                user = {**user, "admin": session.get("vouched") is True and user["email"] in settings.admin_emails}
        g.user = user
    return g.user


def reads_exactly() -> bool:
    """Whether this request reads what many entities add up to each time, or from a copy kept a few seconds
    (Cache.kept_copy): only an admin reads exactly; anyone else may ask as often as they like, and each shard is a
    billed read."""
    user = current_user()
    return user is not None and user["admin"]


def require_user() -> people.User:
    user = current_user()
    if user is None:
        raise SignInRequired("Sign in first.")
    return user


def require_admin() -> people.User:
    user = require_user()
    if not user["admin"]:
        raise Forbidden("Only an admin may do this.")
    return user


def dev_sign_in(email: object, admin: object) -> people.User:
    """Sign in locally as `email`; refused wherever Settings.dev_signin is off."""
    if not runtime.current().settings.dev_signin:
        raise NotFound("Dev sign-in does not exist here (only in local development, against a Datastore emulator, "
                       "with DEV_SIGNIN=on).")
    if not isinstance(email, str) or len(email) > 254 or not EMAIL_PATTERN.fullmatch(email) \
            or validate.UNSAFE_CHARACTERS.search(email):  # the form's too: a noncharacter is valid UTF-8
        raise Unprocessable("Give a valid email address.", "bad_email")
    if not isinstance(admin, bool):
        raise Unprocessable("admin must be true or false.", "bad_admin")
    return _keep(make_user(dev_user_id(email), email, admin))


def google_sign_in(credential: object, keys: GoogleKeys) -> people.User:
    """Sign in with the ID token Sign in with Google gave the browser (its `credential`)."""
    settings = runtime.current().settings
    if not settings.google_client_id:
        raise NotFound("Sign in with Google is not set up here (GOOGLE_CLIENT_ID).")
    refused = AppError("That Google sign-in could not be verified; sign in again.", "bad_credential", 401)
    claims = verify_google_id_token(credential, settings.google_client_id, keys)
    if claims is None:
        raise refused
    vouched = email_is_the_accounts(claims)
    admin = vouched and claims["email"].lower() in settings.admin_emails
    # The app's sign-in button issues tokens whose `azp` is its client id. Anyone may also mint a Google-signed token
    # with this audience for a service account of their own (gcloud auth print-identity-token --audiences): such a
    # token is taken from an admin only (make load's --token), never as one more anonymous writer.
    if claims.get("azp", settings.google_client_id) != settings.google_client_id and not admin:
        raise refused
    return _keep(make_user(f"google:{claims['sub']}", claims["email"], admin), vouched)


def _keep(user: people.User, vouched: bool = False) -> people.User:
    """A fresh session holding `user`, the sign-in's time and generation; `vouched`: email_is_the_accounts."""
    session.clear()
    session["user"] = user
    session["vouched"] = vouched
    session["signed_in"] = int(time.time())
    session["generation"] = generation(user["id"])
    g.user = user
    return user


def sign_out() -> None:
    """Sign out, here and wherever a copy of this cookie is: all of the person's sign-ins so far end."""
    user = current_user()
    if user is not None:
        _renew_generation(user["id"])
    session.clear()
    g.user = None
