"""Local services for development and tests: the Datastore emulators and the cache (see services.py)."""
from devstack.services import DevstackError, Emulator, Memcached, Redis, Stack, free_port

__all__ = ["DevstackError", "Emulator", "Memcached", "Redis", "Stack", "free_port"]
