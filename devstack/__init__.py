"""Local services for development and tests: the Datastore emulator and memcached (see services.py)."""
from devstack.services import DevstackError, Emulator, Memcached, Stack, free_port

__all__ = ["DevstackError", "Emulator", "Memcached", "Stack", "free_port"]
