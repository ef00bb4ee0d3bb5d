"""The live figure of the mapper's lesson on the tour (its demo data is the accounts': see accounts/demo.py)."""
from typing import Any

from mapper import service


def figure() -> dict[str, Any] | None:
    """The latest job, as the jobs page shows it; None before any job has run."""
    jobs = service.list_jobs(limit=1)
    return service.job_dict(jobs[0]) if jobs else None
