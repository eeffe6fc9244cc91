"""The configs ``inferd tune`` tries: a model's stated config with its batching, instance count,
ONNX Runtime threads and precision changed, each change one field of ``Candidate``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferd._proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

INTRA_OP = "intra_op_thread_count"


@dataclass(frozen=True)
class Candidate:
    """One config to measure. ``queue_delay_us`` None: no dynamic batching (each request runs
    alone unless it brings a batch); ``intra_op_threads`` 0: the server's default;
    ``precision``: fp32 (the model as given), fp16 or int8 (a variant ``variants.py`` made)."""

    max_batch_size: int
    queue_delay_us: int | None = None
    preferred_batch_sizes: tuple[int, ...] = ()
    instances: int = 1
    intra_op_threads: int = 0
    graph_level: int = 0  # Triton's optimization.graph.level: 0 all, -1 basic, 1 extended
    precision: str = "fp32"

    def with_(self, **changes: object) -> Candidate:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        batching = (
            "no dynamic batching"
            if self.queue_delay_us is None
            else f"dynamic {self.queue_delay_us} µs"
            + (f" pref {list(self.preferred_batch_sizes)}" if self.preferred_batch_sizes else "")
        )
        threads = f"{self.intra_op_threads} threads" if self.intra_op_threads else "default threads"
        graph = {0: "", -1: ", graph basic", 1: ", graph extended", 2: ", graph none"}
        return (
            f"mbs {self.max_batch_size}, {batching}, {self.instances} inst, {threads}"
            f"{graph.get(self.graph_level, '')}, {self.precision}"
        )

    def config(self, stated: ModelConfig) -> ModelConfig:
        """``stated`` with this candidate's settings (every other field as the user wrote it)."""
        config = ModelConfig()
        config.CopyFrom(stated)
        config.max_batch_size = self.max_batch_size
        config.ClearField("dynamic_batching")
        if self.queue_delay_us is not None:
            config.dynamic_batching.max_queue_delay_microseconds = self.queue_delay_us
            config.dynamic_batching.preferred_batch_size.extend(self.preferred_batch_sizes)
        kind = (
            stated.instance_group[0].kind if stated.instance_group else ModelInstanceGroup.KIND_AUTO
        )
        config.ClearField("instance_group")
        config.instance_group.add(count=self.instances, kind=kind)
        if self.intra_op_threads:
            config.parameters[INTRA_OP].string_value = str(self.intra_op_threads)
        elif INTRA_OP in config.parameters:
            del config.parameters[INTRA_OP]
        config.optimization.graph.level = self.graph_level
        if not config.optimization.graph.ListFields():
            config.optimization.ClearField("graph")
        if not config.optimization.ListFields():
            config.ClearField("optimization")
        return config


def stated_candidate(stated: ModelConfig, completed: ModelConfig) -> Candidate:
    """The config as the user wrote it, as a Candidate: the baseline every change is measured
    against. Its batching is the completed config's: a batching model that names no scheduler is
    served with ``dynamic_batching { }`` (as Triton's ONNX Runtime backend completes it)."""
    delay: int | None = None
    if completed.HasField("dynamic_batching"):
        delay = completed.dynamic_batching.max_queue_delay_microseconds
    instances = sum(g.count or 1 for g in stated.instance_group) or 1
    threads = stated.parameters[INTRA_OP].string_value if INTRA_OP in stated.parameters else ""
    return Candidate(
        max_batch_size=completed.max_batch_size,
        queue_delay_us=delay,
        preferred_batch_sizes=tuple(completed.dynamic_batching.preferred_batch_size),
        instances=instances,
        intra_op_threads=int(threads) if threads.isdigit() else 0,
        graph_level=stated.optimization.graph.level,
    )
