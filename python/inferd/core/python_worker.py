"""The core's side of python-backend models (cpp/include/inferd/python_worker_executor.h): a
worker's shared-memory ring and the session that the core's worker threads run its batches
through, without the GIL."""

from __future__ import annotations

import inferd._core as _core

WorkerRing = _core.WorkerRing
CancellationFlag = _core.CancellationFlag
PythonWorkerSession = _core.PythonWorkerSession
# A decoupled model's responses, streamed on its worker's ring (streamed_responses.h).
StreamedResponses = _core.StreamedResponses
# Python models' calls to other models as the core routes them (cpp/include/inferd/model_calls.h).
ModelCalls = _core.ModelCalls
