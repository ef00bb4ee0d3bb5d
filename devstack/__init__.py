"""Local services for development and tests: the Datastore emulators and the cache (see services.py)."""
from devstack.services import DatastoreEmulator, DevstackError, FirestoreEmulator, Memcached, Redis, Stack, free_port

__all__ = ["DatastoreEmulator", "DevstackError", "FirestoreEmulator", "Memcached", "Redis", "Stack", "free_port"]
