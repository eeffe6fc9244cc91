"""What the core needs from an executor."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Executor(Protocol):
    """One model instance. The core calls ``execute`` from one worker thread at a time.

    ``inputs`` come in the config's input order, batch along dim 0 when the model batches; BYTES
    inputs are object arrays of ``bytes``, BF16 inputs uint16 arrays of raw bits, and an optional
    input the batch's requests left out is None. The result is
    every output in the config's output order, as arrays of the declared types (BYTES: object
    arrays of ``bytes`` or ``str``; BF16: uint16). Raise an ``inferd.errors`` error to answer the
    batch with its code; anything else becomes INTERNAL. Release the GIL while computing.
    """

    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]: ...

    def close(self) -> None:
        """Free the instance's resources. Called once, after the last ``execute``."""
