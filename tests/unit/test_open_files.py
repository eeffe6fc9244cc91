"""The "open files near the limit" warning fires at the limit itself (issue 25, item 4), where
listing /proc/self/fd fails with EMFILE for want of the descriptor it needs."""

from __future__ import annotations

import json
import subprocess
import sys

# Runs in a process of its own: it lowers its descriptor limit and fills every slot, which would
# break pytest. Prints the records the watch logged, at the limit and after freeing the slots.
AT_THE_LIMIT = """
import json, os, resource
import structlog.testing
from inferd.observability.open_files import OpenFilesWatch

hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
limit = len(os.listdir("/proc/self/fd")) + 32
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass  # EMFILE: every slot is taken
watch = OpenFilesWatch()
with structlog.testing.capture_logs() as at_limit:
    watch.check()
for fd in held:
    os.close(fd)
with structlog.testing.capture_logs() as after:
    watch.check()
print(json.dumps({"limit": limit, "at_limit": at_limit, "after": after}))
"""


def test_the_warning_fires_when_every_descriptor_is_taken() -> None:
    done = subprocess.run(
        [sys.executable, "-c", AT_THE_LIMIT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert len(seen["at_limit"]) == 1, seen  # before the fix: none (EMFILE read as "unknown")
    (warning,) = seen["at_limit"]
    assert warning["event"] == "open files near the limit", warning
    assert warning["log_level"] == "warning"
    assert warning["open_files"] == warning["limit"] == seen["limit"]
    (cleared,) = seen["after"]
    assert cleared["event"] == "open files back under the limit", cleared
    assert cleared["open_files"] < 0.8 * seen["limit"]
