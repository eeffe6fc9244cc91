"""How a model version's requests are queued and batched: the dynamic_batching section of its
config, as plain data (Triton's ModelDynamicBatching and ModelQueuePolicy)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class QueuePolicy:
    delay_on_timeout: bool = False  # on a queue timeout: move behind (DELAY) rather than reject
    default_timeout_us: int = 0  # 0 = no queue timeout
    allow_timeout_override: bool = False  # a request's `timeout` parameter may shorten it
    max_queue_size: int = 0  # 0 = unbounded; else RESOURCE_EXHAUSTED past it


@dataclass(frozen=True)
class Padding:
    """Variable-length inputs padded to the longest of their batch (see README, "Padding")."""

    inputs: tuple[bool, ...] = ()  # by input index
    value: float = 0.0
    reference_input: int = -1  # -1 = no padding
    # by output index: (output dim, reference input dim) pairs to slice back per request
    outputs: tuple[tuple[tuple[int, int], ...], ...] = ()


@dataclass(frozen=True)
class BatchingPolicy:
    dynamic: bool = False  # False: each request runs alone through the same path
    max_batch_size: int = 0  # rows; 0 = the model does not batch
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0  # 0 = send what is ready, never wait
    priority_levels: int = 0  # 0 = one level; the request's `priority` is then ignored
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    level_queue_policies: dict[int, QueuePolicy] = field(default_factory=dict)
    preserve_ordering: bool = False
    padding: Padding = field(default_factory=Padding)
