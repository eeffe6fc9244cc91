from collections.abc import Callable
from typing import Any

class WorkerLoop:
    def __init__(self, fds: str) -> None: ...
    def serve(
        self,
        execute: Callable[[list[Any]], Any],
        make_request: Callable[..., Any],
        resolve: Callable[[Any], Any],
        report: Callable[[BaseException], str],
        response_type: type,
        should_stop: Callable[[], bool],
    ) -> None: ...
    def wake(self) -> None: ...
    def respond(
        self,
        batch: int,
        index: int,
        final: bool,
        outputs: list[tuple[str, Any]] | None,
        error: str | None,
    ) -> None: ...
