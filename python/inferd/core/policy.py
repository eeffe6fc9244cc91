"""How a model version's requests are queued and batched, in the core's own types: Triton's
ModelDynamicBatching, ModelQueuePolicy and ModelSequenceBatching, and inferd's padding of
variable-length inputs.

They are the bound C++ structs the core's Scheduler takes, read-only, built by keyword with the
core's defaults (``BatcherOptions(dynamic=True, max_batch_size=8)``) and equal when every field
is. ``inferd.repository.batching_config`` and ``sequence_config`` build them from a model's config,
once.
"""

from __future__ import annotations

import inferd._core as _core

BatcherOptions = _core.BatcherOptions
QueuePolicy = _core.QueuePolicy
Padding = _core.Padding
SequenceOptions = _core.SequenceOptions
SequenceStateMemory = _core.SequenceStateMemory
