"""The process's file descriptors: every connection holds one, and past the limit new clients
cannot connect (and /metrics stops). The soft limit is raised to the hard one at start, and a
warning is logged while the count is near it."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

# Warn at this share of the limit; say it is over once below the lower one (no flapping).
WARN_FRACTION = 0.9
CLEAR_FRACTION = 0.8
CHECK_INTERVAL_S = 2.0


def raise_open_file_limit() -> None:
    """Sets the soft RLIMIT_NOFILE to the hard limit (systemd's default soft limit, 1024, is
    reached by 1,000 idle clients) and logs both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:  # e.g. an infinite hard limit the kernel caps
            log.warning("cannot raise the open file limit", soft=soft, hard=hard, reason=str(e))
    log.info("open file limit", soft=soft, hard=hard, soft_at_start=before)


def open_file_count(limit: int) -> int | None:
    """File descriptors this process holds; None where /proc cannot tell. Listing
    /proc/self/fd takes a descriptor itself: when none is left (EMFILE) the count is ``limit``."""
    try:
        return sum(1 for _ in os.scandir("/proc/self/fd"))
    except OSError as e:
        return limit if e.errno == errno.EMFILE else None


@dataclass
class OpenFilesWatch:
    """Logs "open files near the limit" (warning) when the count reaches WARN_FRACTION of the
    soft limit, and "open files back under the limit" once it drops below CLEAR_FRACTION."""

    near_limit: bool = False

    def check(self) -> None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY or limit <= 0:
            return
        count = open_file_count(limit)
        if count is None:
            return
        if not self.near_limit and count >= WARN_FRACTION * limit:
            self.near_limit = True
            log.warning("open files near the limit", open_files=count, limit=limit)
        elif self.near_limit and count < CLEAR_FRACTION * limit:
            self.near_limit = False
            log.info("open files back under the limit", open_files=count, limit=limit)

    async def run(self, interval_s: float = CHECK_INTERVAL_S) -> None:
        while True:
            self.check()
            await asyncio.sleep(interval_s)
