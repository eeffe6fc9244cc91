# Type stub for the C++ extension built from cpp/bindings (see module.cpp). Keep in step with it.
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

class StatusCode:
    __members__: ClassVar[dict[str, StatusCode]]
    OK: ClassVar[StatusCode]
    INVALID_ARGUMENT: ClassVar[StatusCode]
    NOT_FOUND: ClassVar[StatusCode]
    UNAVAILABLE: ClassVar[StatusCode]
    RESOURCE_EXHAUSTED: ClassVar[StatusCode]
    DEADLINE_EXCEEDED: ClassVar[StatusCode]
    CANCELLED: ClassVar[StatusCode]
    INTERNAL: ClassVar[StatusCode]
    def __int__(self) -> int: ...

class CompletionQueue:
    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    def drain(
        self,
    ) -> list[tuple[int, int, str, list[tuple[int, tuple[int, ...], np.ndarray]]]]: ...

class Scheduler:
    def __init__(
        self,
        model_name: str,
        max_batch_size: int,
        executors: list[Any],
        output_datatypes: list[int],
        completions: CompletionQueue,
    ) -> None: ...
    def submit(
        self, token: int, batch_size: int, inputs: list[tuple[int, Sequence[int], Any]]
    ) -> tuple[int, str]: ...
    def shutdown(self, reject_queued: bool) -> None: ...
    def pending_requests(self) -> int: ...
    def instance_count(self) -> int: ...
    def statistics(self) -> dict[str, Any]: ...
