"""Settings, read once per process from the environment."""
import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import production_latency

DEV_SECRET = "dev-only-secret-not-for-app-engine"
# The shortest SECRET_KEY a deployment takes, set directly or from Secret Manager: 32 bytes (256 bits, as
# `secrets.token_hex(32)` or `make deploy`'s secret give). The session cookie and the task tokens are HMACs of what an
# attacker can read, so a short key can be searched for offline from one cookie, then sign any session. Local
# development (an emulator) is exempt: its data is the developer's own, and its default key (DEV_SECRET) is public.
SECRET_MIN_BYTES = 32
# The names a local app answers to: a page of another site whose name the attacker points at 127.0.0.1 (DNS
# rebinding) comes with that name in Host, refused. No IPv6 literal: Werkzeug 3.1 compares a listed name only up to its
# first ':' (so "[::1]" never matches), and nothing here listens on ::1.
LOCAL_HOSTS = ("localhost", "127.0.0.1")
HOST_NAME = re.compile(r"\.?[a-z0-9-]{1,63}(\.[a-z0-9-]{1,63})*")  # a DNS name or an IPv4 address, no port


MAX_CACHE_EXPIRE = 30 * 24 * 3600  # memcached: "up to 30 days", else a Unix time (protocol.txt, "Expiration times")


@dataclass(frozen=True)
class WriteBudget:
    """How much one signed-in person may create in `window` seconds (core/budget.py); a script flooding the pages
    everyone reads meets a 429. WRITE_BUDGET="comments=20,counters=10,posts=20,window=600" (any of them)."""
    comments: int = 20
    counters: int = 10
    posts: int = 20
    window: int = 600

    @classmethod
    def parse(cls, text: str) -> "WriteBudget":
        figures: dict[str, int] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            name, _, value = part.partition("=")
            if name.strip() not in cls.__dataclass_fields__ or not value.strip().isdigit() or int(value) < 1:
                raise RuntimeError(f"WRITE_BUDGET: {part!r} is not one of comments=N, counters=N, posts=N, window=S "
                                   "(whole numbers from 1).")
            figures[name.strip()] = int(value)
        if figures.get("window", cls.window) > MAX_CACHE_EXPIRE:  # else every count would expire at once
            raise RuntimeError(f"WRITE_BUDGET: window is at most {MAX_CACHE_EXPIRE} s (30 days, memcached's longest "
                               "relative expiry).")
        return cls(**figures)


@dataclass(frozen=True)
class Settings:
    project: str
    emulator_host: str | None
    # "firestore": Firestore in Datastore mode, what App Engine apps use today (pessimistic locks, server-side
    # increments); "legacy": the legacy Datastore emulator (optimistic, aborts at once; no server-side increments).
    backend: str = "legacy"
    namespace: str | None = None  # the Datastore namespace every context uses (tests isolate themselves by it)
    # The cache (core/cache.py): memcached hosts ("host:port") or a Redis/Valkey URL, at most one; neither: no cache.
    memcached_hosts: tuple = ()
    redis_url: str | None = None
    # With REDIS_URL rediss://: the PEM text of the CA that signs the server's certificate (cache_ca_pem below).
    cache_ca: str | None = None
    secret_key: str = DEV_SECRET
    admin_emails: frozenset = field(default_factory=frozenset)
    on_app_engine: bool = False
    # The dev sign-in (an email and an admin box, no password) lets anyone in as an admin: on only against an emulator
    # (DATASTORE_EMULATOR_HOST), off App Engine standard, and when DEV_SIGNIN=on. The emulator is what makes it safe on
    # any platform: a deployment against the real Datastore has none, whatever else is set (docs/security.md).
    dev_signin: bool = False
    # Sign in with Google (core/identity.py): the OAuth web client's id, whose ID tokens the app accepts.
    google_client_id: str | None = None
    # Task queues (core/tasks.py): Cloud Tasks on App Engine; off it, devstack's local Cloud Tasks at this address.
    tasks_emulator_host: str | None = None
    tasks_location: str | None = None
    tasks_queue: str = "mapper"
    # The host names the app answers to (another Host is a 400), a leading "." taking subdomains; empty: any (App
    # Engine routes only this app's names here, but any number: `<anything>-dot-PROJECT.appspot.com`). Atom ids and
    # cached pages' keys are built from the canonical name, never from a request's Host.
    trusted_hosts: tuple = LOCAL_HOSTS
    canonical_host: str = LOCAL_HOSTS[0]
    latency: str = "none"  # LATENCY: the modelled waits before each round trip (core/production_latency.py)
    latency_seed: int | None = None  # LATENCY_SEED: the model's draws the same run after run (None: fresh)
    write_budget: WriteBudget = field(default_factory=WriteBudget)
    # The mapper's sweep (mapper/sweep.py): a running task's record is leased for `mapper_lease_seconds` from each
    # chunk's commit; every `mapper_sweep_seconds` the sweep queues again the tasks whose lease ran out.
    mapper_lease_seconds: int = 120
    mapper_sweep_seconds: int = 60

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        gae = env.get("GAE_ENV") == "standard"
        secret = env.get("SECRET_KEY")
        local = local_development(env)
        if not secret and not local:
            # A known key anywhere but a developer's machine would let anyone forge a session cookie or a task token.
            raise RuntimeError("SECRET_KEY must be set on App Engine: set SECRET_KEY_SECRET to its Secret Manager "
                               "secret" if gae
                               else "SECRET_KEY must be set outside local development (a local Datastore emulator): "
                                    "the development secret is public.")
        if secret and not local:
            require_long_key(secret, "SECRET_KEY")
        tasks_emulator = None if gae else env.get("CLOUD_TASKS_EMULATOR_HOST") or None
        tasks_location = tasks_region(env.get("TASKS_LOCATION") or "") or ("local" if tasks_emulator else None)
        if gae and not REGION_NAME.fullmatch(tasks_location or ""):
            said = (f"TASKS_LOCATION {tasks_location!r} is not a region's name" if tasks_location
                    else "TASKS_LOCATION must be set for Cloud Tasks")
            raise RuntimeError(f"{said}: set TASKS_LOCATION to the app's region as Cloud Tasks names it. `gcloud app "
                               "describe --format='value(locationId)'` prints it, us-central meaning us-central1 and "
                               "europe-west meaning europe-west1.")
        google_client_id = env.get("GOOGLE_CLIENT_ID", "").strip() or None
        if gae and not google_client_id:
            raise RuntimeError("GOOGLE_CLIENT_ID must be set on App Engine: the id of the OAuth web client that "
                               "Sign in with Google issues tokens for (docs/deploy.md, 'Sign-in'); without it "
                               "nobody can sign in, so nobody can write and there is no admin.")
        if google_client_id and not GOOGLE_CLIENT_ID.fullmatch(google_client_id):
            raise RuntimeError(f"GOOGLE_CLIENT_ID {google_client_id!r} is not an OAuth client id: set it to the web "
                               "client's id, which ends in .apps.googleusercontent.com.")
        datastore_backend = env.get("DATASTORE_BACKEND") or ("firestore" if gae else "legacy")
        if datastore_backend not in ("legacy", "firestore"):
            raise RuntimeError("DATASTORE_BACKEND must be legacy or firestore.")
        memcached_hosts = tuple(env.get("MEMCACHED_HOSTS", "").replace(",", " ").split())
        redis_url = env.get("REDIS_URL") or None
        if memcached_hosts and redis_url:
            raise RuntimeError("Set MEMCACHED_HOSTS or REDIS_URL, not both: the app uses one cache.")
        if redis_url and not redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise RuntimeError("REDIS_URL must be a redis://host:port[/db] URL (rediss:// for TLS).")
        cache_ca = cache_ca_pem(env.get("CACHE_CA_FILE", "").strip(), redis_url)
        latency = env.get("LATENCY") or "none"
        if latency not in production_latency.NAMES:
            raise RuntimeError(f"LATENCY must be {', '.join(production_latency.NAMES)}.")
        if latency != "none" and not local:
            raise RuntimeError(f"LATENCY={latency} models production's waits on a local emulator; it cannot be set "
                               "anywhere else.")
        project = env.get("DATASTORE_DATASET") or env.get("GOOGLE_CLOUD_PROJECT") or "scalable-demo"
        return cls(
            project=project,
            emulator_host=env.get("DATASTORE_EMULATOR_HOST") or None,
            backend=datastore_backend,
            namespace=env.get("DATASTORE_NAMESPACE") or None,
            memcached_hosts=memcached_hosts,
            redis_url=redis_url,
            cache_ca=cache_ca,
            secret_key=secret or DEV_SECRET,
            admin_emails=frozenset(e.strip().lower() for e in env.get("ADMIN_EMAILS", "").split(",") if e.strip()),
            on_app_engine=gae,
            dev_signin=dev_signin_on(env),
            google_client_id=google_client_id,
            tasks_emulator_host=tasks_emulator,
            tasks_location=tasks_location,
            tasks_queue=env.get("TASKS_QUEUE") or "mapper",
            latency=latency,
            latency_seed=production_latency.seed_from(env),
            write_budget=WriteBudget.parse(env.get("WRITE_BUDGET", "")),
            mapper_lease_seconds=seconds_setting(env, "MAPPER_LEASE_SECONDS", MAPPER_LEASE_SECONDS),
            mapper_sweep_seconds=seconds_setting(env, "MAPPER_SWEEP_SECONDS", MAPPER_SWEEP_SECONDS),
            **hosts(env.get("TRUSTED_HOSTS", ""), gae, project),
        )

    @property
    def sign_in_offered(self) -> bool:
        """Whether anyone can sign in here: with Google, or with the dev form (local development only)."""
        return bool(self.google_client_id) or self.dev_signin

    @property
    def canonical_url_root(self) -> str:
        """The app's own URL root, whatever Host a request came with: https on App Engine (`secure: always`)."""
        return f"{'https' if self.on_app_engine else 'http'}://{self.canonical_host}"


MAPPER_LEASE_SECONDS, MAPPER_SWEEP_SECONDS = Settings.mapper_lease_seconds, Settings.mapper_sweep_seconds


def seconds_setting(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or not 1 <= int(value) <= 86400:
        raise RuntimeError(f"{name} must be a whole number of seconds from 1 to 86400.")
    return int(value)


# App Engine calls two regions by older names than every other service, Cloud Tasks included: "europe-west and
# us-central in App Engine commands ... are called europe-west1 and us-central1 elsewhere"
# (https://cloud.google.com/appengine/docs/standard/locations). `gcloud app describe` prints the App Engine name.
APP_ENGINE_REGION_NAMES = {"us-central": "us-central1", "europe-west": "europe-west1"}
GOOGLE_CLIENT_ID = re.compile(r"[0-9A-Za-z_-]{1,120}\.apps\.googleusercontent\.com")
REGION_NAME = re.compile(r"[a-z]+(?:-[a-z]+)+[0-9]+")


def tasks_region(location: str) -> str:
    """TASKS_LOCATION as Cloud Tasks names the region: App Engine's own name for it is taken too."""
    location = location.strip().lower()
    return APP_ENGINE_REGION_NAMES.get(location, location)


def hosts(text: str, gae: bool, project: str) -> dict[str, Any]:
    """{"trusted_hosts", "canonical_host"} from TRUSTED_HOSTS (comma-separated names, the first the canonical one).
    Unset: the loopback names locally; on App Engine any name, PROJECT.appspot.com the canonical one."""
    names = tuple(name.strip().lower() for name in text.split(",") if name.strip())
    if not names:
        return {"trusted_hosts": () if gae else LOCAL_HOSTS,
                "canonical_host": f"{project}.appspot.com" if gae else LOCAL_HOSTS[0]}
    bad = [name for name in names if not HOST_NAME.fullmatch(name)]
    if bad or names[0].startswith("."):
        raise RuntimeError(f"TRUSTED_HOSTS must be host names, comma-separated, the first (the app's canonical name) "
                           f"without a leading '.': {', '.join(bad) or names[0]!r} is not.")
    return {"trusted_hosts": names, "canonical_host": names[0]}


# CACHE_CA_FILE is named relative to the app's folder (the one app.yaml is in), whatever the working directory.
APP_ROOT = Path(__file__).resolve().parent.parent
CA_COMMAND = ("gcloud memorystore instances get-certificate-authority INSTANCE --location=REGION, or `python -m "
              "devstack.preflight --save-valkey-ca` which saves it")


def cache_ca_pem(name: str, redis_url: str | None) -> str | None:
    """The CA certificates CACHE_CA_FILE names, as PEM text, when REDIS_URL is rediss://. Memorystore for Valkey signs
    the server's certificate with a CA of the instance's own, which a client must download and trust
    (https://cloud.google.com/memorystore/docs/valkey/about-in-transit-encryption): without it every connection fails,
    so the app refuses to start rather than run with every cache call a miss."""
    tls = bool(redis_url and redis_url.startswith("rediss://"))
    if not name:
        if tls:
            raise RuntimeError("REDIS_URL is rediss:// but CACHE_CA_FILE is not set: save the instance's CA beside "
                               f"app.yaml ({CA_COMMAND}) and set CACHE_CA_FILE to the file's name.")
        return None
    if not tls:
        raise RuntimeError("CACHE_CA_FILE is set but REDIS_URL is not rediss://: the CA is for in-transit encryption "
                           "only; use rediss:// or leave CACHE_CA_FILE empty.")
    try:
        text = (APP_ROOT / name).read_text()
        ssl.create_default_context(cadata=text)  # refuses anything but certificates
    except (OSError, ValueError, ssl.SSLError) as e:
        raise RuntimeError(f"CACHE_CA_FILE {name!r} is not a readable PEM file of CA certificates ({e}): save the "
                           f"instance's CA there ({CA_COMMAND}).") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise RuntimeError(f"CACHE_CA_FILE {name!r} holds no PEM certificate: save the instance's CA there "
                           f"({CA_COMMAND}).")
    return text


# SECRET_KEY_SECRET: a Secret Manager secret's name ("app-secret-key", in the app's own project) or a version's full
# name (projects/PROJECT/secrets/NAME/versions/VERSION).
SECRET_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")
SECRET_VERSION = re.compile(r"projects/[^/\s]+/secrets/[A-Za-z0-9_-]{1,255}/versions/[A-Za-z0-9_-]+")


def secret_version(env: Mapping[str, str]) -> str | None:
    """The full name of the secret version SECRET_KEY_SECRET names, or None when it names none."""
    wanted = env.get("SECRET_KEY_SECRET", "").strip()
    if not wanted:
        return None
    if env.get("SECRET_KEY"):
        raise RuntimeError("Set SECRET_KEY or SECRET_KEY_SECRET, not both: the app uses one key.")
    if SECRET_NAME.fullmatch(wanted):
        # App Engine sets it (https://cloud.google.com/appengine/docs/standard/python3/runtime#environment_variables)
        if not env.get("GOOGLE_CLOUD_PROJECT"):
            raise RuntimeError(f"SECRET_KEY_SECRET {wanted!r} names a secret but GOOGLE_CLOUD_PROJECT is not set: set "
                               "it, or name the version in full, projects/PROJECT/secrets/NAME/versions/latest.")
        wanted = f"projects/{env['GOOGLE_CLOUD_PROJECT']}/secrets/{wanted}/versions/latest"
    if not SECRET_VERSION.fullmatch(wanted):
        raise RuntimeError(f"SECRET_KEY_SECRET {wanted!r} is not a secret's name: set it to one (app-secret-key) or "
                           "to a version's full name, projects/PROJECT/secrets/NAME/versions/latest.")
    return wanted


def with_secret_key(env: Mapping[str, str], client: Any = None) -> Mapping[str, str]:
    """`env` with SECRET_KEY read from Secret Manager when SECRET_KEY_SECRET names a secret, once per process. A key in
    app.yaml's env_variables would be shown to anyone who may view the version's configuration
    (https://cloud.google.com/appengine/docs/standard/reference/app-yaml#env_variables); a secret only to those granted
    it. `client`: a SecretManagerServiceClient."""
    wanted = secret_version(env)
    if wanted is None:
        return env
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions
    from google.cloud import secretmanager

    try:
        client = client or secretmanager.SecretManagerServiceClient()
        payload = client.access_secret_version(name=wanted, timeout=30).payload.data.decode().strip()
    except (exceptions.GoogleAPICallError, exceptions.RetryError, auth_exceptions.GoogleAuthError) as e:
        said = " ".join(str(e).split())  # one line
        raise RuntimeError(f"SECRET_KEY could not be read from Secret Manager, {wanted}: {said} (`make deploy` "
                           "creates the secret and lets the app's service account read it: roles/secretmanager."
                           "secretAccessor).") from None
    require_long_key(payload, f"The secret {wanted}")
    return {**env, "SECRET_KEY": payload}


def require_long_key(key: str, whose: str) -> None:
    """A session key of at least SECRET_MIN_BYTES bytes (an accented letter is two), else refused, saying whose."""
    if len(key.encode()) < SECRET_MIN_BYTES:
        raise RuntimeError(f"{whose} holds {len(key.encode())} bytes: a session key needs at least {SECRET_MIN_BYTES} "
                           "(`python -c 'import secrets; print(secrets.token_hex(32))'` makes one).")


def local_development(env: Mapping[str, str]) -> bool:
    """Against a Datastore emulator, off App Engine standard: nothing the app reaches is production data."""
    return env.get("GAE_ENV") != "standard" and bool(env.get("DATASTORE_EMULATOR_HOST"))


def dev_signin_on(env: Mapping[str, str]) -> bool:
    return local_development(env) and env.get("DEV_SIGNIN") == "on"


def refuse_dev_signin_off_loopback(dev_signin: bool, binds: list[str]) -> None:
    """A RuntimeError naming the fix when the dev sign-in would be served on gunicorn `binds` other than loopback.
    TRUSTED_HOSTS does not guard that: a client elsewhere on the network can send `Host: 127.0.0.1`."""
    if not dev_signin:
        return
    for bind in binds:
        host = bind.rpartition(":")[0].strip("[]") if ":" in bind else bind
        if bind.startswith(("unix:", "fd://")) or host == "localhost":
            continue  # a socket of this machine's, not the network's, or the loopback name
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False  # a name, or no host at all (every interface)
        if not loopback:
            raise RuntimeError(f"the dev sign-in (DEV_SIGNIN=on) lets anyone in as an admin, and this server would "
                               f"listen on {bind!r}: bind to 127.0.0.1, or leave DEV_SIGNIN unset.")
