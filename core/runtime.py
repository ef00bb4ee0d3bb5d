"""What a process builds once and every request reuses: settings, the ndb client, the memcached client, the task queue.

`create_app` configures it; scripts (bench/, the seed command) do the same. Service modules read it through
`current()` so they stay free of Flask.
"""
from core import cache as cache_module
from core import datastore as datastore_module
from core import tasks as tasks_module
from core.settings import Settings


class Runtime:
    def __init__(self, settings):
        self.settings = settings
        self.memcache_client = cache_module.make_client(settings.memcached_hosts)
        self.cache = cache_module.Cache(self.memcache_client)
        self.datastore = datastore_module.Datastore(
            datastore_module.make_client(settings),
            cache_module.make_global_cache(self.memcache_client),
            datastore_module.ServerIncrements(settings) if settings.backend == "firestore" else None)
        self.tasks = tasks_module.make_queue(settings, self.cache)

    def close(self):
        if self.memcache_client is not None:
            self.memcache_client.close()


_current = None


def configure(settings=None):
    """Build the process's runtime (replacing any earlier one) and return it."""
    global _current
    if _current is not None:
        _current.close()
    _current = Runtime(settings or Settings.from_env())
    return _current


def current():
    if _current is None:
        raise RuntimeError("core.runtime.configure() has not run in this process")
    return _current


def cache():
    return current().cache


def tasks():
    return current().tasks
