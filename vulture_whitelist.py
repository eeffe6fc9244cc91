"""Names in python/inferd that vulture reports as unused but that are used where it cannot see:
by grpc, prometheus_client, protobuf, ONNX Runtime or pybind11 through their own lookups, by the
tests and benchmarks (outside the scanned tree), or by a protocol's signature. `make lint` passes
this file to vulture with the package; vulture only reads it. Vulture matches names, not objects:
an entry here hides every unused attribute of that name, so keep entries few and say why each is
used."""


class _Any:
    """Any attribute is None: the entries below are plain attribute reads."""

    def __getattr__(self, name: str) -> None:
        return None


_ = _Any()

# transport/servicer.py: InferenceServicer's RPC methods; add_inference_service looks each up by
# the proto service's method name (getattr), and grpc calls it.
_.ServerLive
_.ServerReady
_.ModelReady
_.ServerMetadata
_.ModelMetadata
_.ModelStatistics
_.RepositoryIndex
_.RepositoryModelLoad
_.RepositoryModelUnload
_.ModelInfer
_.LogSettings
_.TraceSetting
_.SystemSharedMemoryStatus
_.SystemSharedMemoryRegister
_.SystemSharedMemoryUnregister
_.CudaSharedMemoryStatus
_.CudaSharedMemoryRegister
_.CudaSharedMemoryUnregister

# observability/ (core_metrics.py, failure_counts.py, host_metrics.py, metrics_http.py):
# prometheus_client's Collector interface; the registry calls collect() at each scrape.
_.collect
# observability/metrics_http.py: the /metrics HTTP server's hooks, read by the standard library's
# socketserver and http.server: the server class's address_family (IPv6 hosts) and the request
# handler's log_message (overridden so that scrapes are not logged).
_.address_family
_.log_message

# Protobuf message fields, set by assignment and read by the serializer: StatisticDuration.ns and
# LogSettingsResponse.SettingValue's oneof (transport/codec.py), FileDescriptorProto.package
# (transport/reflection.py).
_.ns
_.bool_param
_.uint32_param
_.string_param
_.package

# executors/onnxruntime.py: onnxruntime.SessionOptions properties, read by ONNX Runtime when the
# session is created.
_.intra_op_num_threads
_.inter_op_num_threads
_.log_severity_level

# models/control.py: ControlMode.NONE is built from the --model-control-mode string "none" (the
# default in settings.py) by ControlMode(value) in server.py.
_.NONE

# datatypes.py: serialize_bytes, the protocol's BYTES encoding, used by the tests
# (test_onnxruntime_native.py) and benchmarks/transport_floor.py.
_.serialize_bytes
# datatypes.py: Datatype.contents_field, the typed-contents table the core decodes by; read by the
# tests (test_wire.py checks the core against it) and cpp/fuzz/make_corpus.py.
_.contents_field

# observability/telemetry.py: the context-manager protocol passes __exit__ a traceback argument.
_.traceback

# transport/core_server.py: grpc.aio calls a server interceptor's intercept_service.
_.intercept_service

# repository/ensemble.py: the plan's graph, which tests/unit/test_ensemble_config.py checks; the
# core derives its own from the steps' maps.
_.depends_on

# batching/executor.py: the core calls an executor's execute_requests (looked up like stage, by
# cpp/bindings/python_executor.cpp); issue 17's python-backend executor defines it, and says with
# takes_request_details that it wants each request's id and requested outputs too.
_.execute_requests
_.takes_request_details

# issue 17: called by python-backend model code (Triton's API): python_backend/pb_utils.py is the
# module model.py imports as triton_python_backend_utils; __getattr__ is Python's module hook.
_.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
_.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
_.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
_.INVALID_ARG
_.LogLevel
_.log_info
_.log_warn
_.log_error
_.is_cpu
_.to_dlpack
_.from_dlpack
_.is_cancelled
_.get_response_sender
_.set_release_flags
_.async_exec
_.get_input_tensor_by_name
_.get_output_tensor_by_name
_.get_input_config_by_name
_.get_output_config_by_name
_.using_decoupled_model_transaction_policy
_.triton_string_to_numpy
_.triton_to_numpy_type
_.numpy_to_triton_type
_.serialize_byte_tensor
_.deserialize_bytes_tensor
_.as_dict
_.set_max_batch_size
_.set_dynamic_batching
_.add_input
_.add_output
_.set_model_transaction_policy
_.__getattr__
# issue 17: pb_utils' hooks for the worker process (python_backend/worker.py), which attaches a
# decoupled request's response sender, marks a cancelled request and installs the BLS executor.
_._attach_response_sender
_._mark_cancelled
_.set_bls_executor

# repository/sequence_config.py: _CommonOptions' keys, read by SequenceOptions(**common) (a
# TypedDict's fields are keyword arguments vulture does not follow).
_.max_sequence_idle_us
_.tell_idle_end
_.iterative
_.visible_outputs

# example_decoder.py: the whole-generation baseline and the numpy reference, used by
# benchmarks/continuous_batching.py and the decoder's tests.
_.write_whole_decoder
_.reference_tokens

# python_backend/pb_utils.py: InferenceRequest._release_flags, read by the C++ worker loop
# (cpp/worker/worker_loop.cpp, through pybind11) for a request the model rescheduled.
_._release_flags

# core/load_generator.py: the C++ load generator's options (inferd._core.LoadOptions), read by
# LoadGenerator::run through pybind11.
_.warmup_s
_.measure_s
