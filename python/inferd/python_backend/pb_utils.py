"""inferd's ``triton_python_backend_utils``: the API a Triton python-backend ``model.py`` imports.

Written from Triton's documented behaviour (the python_backend README: Usage, Error Handling,
Decoupled mode, Business Logic Scripting, auto_complete_config, Logging). A worker process puts
this module in ``sys.modules`` as ``triton_python_backend_utils`` before it imports ``model.py``.

Names that exist (everything else Triton documents raises, see below):

* ``Tensor(name, data)``: ``name()``, ``as_numpy()``, ``triton_dtype()``, ``shape()``,
  ``is_cpu()`` (always True). BYTES tensors hold numpy object arrays of ``bytes`` (``str``
  elements are encoded as UTF-8). ``to_dlpack()`` and ``Tensor.from_dlpack()`` raise.
* ``InferenceRequest(model_name, inputs, requested_output_names, model_version=-1,
  request_id="", correlation_id=0, flags=0, timeout=0, parameters=None)``: ``inputs()``,
  ``request_id()``, ``correlation_id()``, ``requested_output_names()``, ``model_name()``,
  ``model_version()``, ``flags()``, ``timeout()``, ``parameters()`` (a JSON string),
  ``is_cancelled()`` (whether the request's client cancelled it while it runs: a stream
  closed or cancelled, a call cancelled or past its deadline; always False for a request model
  code builds),
  ``get_response_sender()`` (decoupled models only), ``exec()`` and ``async_exec()`` (Business
  Logic Scripting; ``decoupled=True``, a call into a decoupled model, raises; a call closing a
  cycle of calls answers an error naming it; ``timeout`` 0 is 60 s),
  ``set_release_flags(flags)`` (``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` gives an iterative
  model's request back for another execute: its place in the returned list None, or, for a
  decoupled model, no final flag sent for it).
* ``InferenceResponse(output_tensors=None, error=None, parameters=None)``: ``output_tensors()``,
  ``has_error()``, ``error()``, ``parameters()`` (a JSON string).
* ``InferenceResponseSender`` (what ``get_response_sender()`` returns): ``send(response=None,
  flags=0)``, ``is_cancelled()``. Once the server ended the request (cancelled or past its
  deadline, and not ended by the model within a second), ``send`` drops what it is given.
* ``TritonError(message, code=TritonError.INTERNAL)``: ``message()``, ``code()``; codes
  ``UNKNOWN``, ``INTERNAL``, ``NOT_FOUND``, ``INVALID_ARG``, ``UNAVAILABLE``, ``UNSUPPORTED``,
  ``ALREADY_EXISTS``, ``CANCELLED``.
* ``TritonModelException(message)``: ``message()``.
* ``ModelConfig`` (the argument of ``auto_complete_config``): ``as_dict()``,
  ``set_max_batch_size(n)``, ``set_dynamic_batching()``, ``add_input(dict)``,
  ``add_output(dict)``, ``set_model_transaction_policy(dict)``.
* ``Logger``: ``log(message, level=Logger.INFO)``, ``log_info``, ``log_warn``, ``log_error``,
  ``log_verbose``; levels ``Logger.INFO``, ``Logger.WARNING``, ``Logger.ERROR``,
  ``Logger.VERBOSE`` (also as ``Logger.LogLevel.*``).
* Functions: ``get_input_tensor_by_name``, ``get_output_tensor_by_name``,
  ``get_input_config_by_name``, ``get_output_config_by_name``,
  ``using_decoupled_model_transaction_policy``, ``triton_string_to_numpy``,
  ``triton_to_numpy_type``, ``numpy_to_triton_type``, ``serialize_byte_tensor``,
  ``deserialize_bytes_tensor``.
* Constants: ``TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`` (1),
  ``TRITONSERVER_REQUEST_FLAG_SEQUENCE_END`` (2), ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (1),
  ``TRITONSERVER_REQUEST_RELEASE_ALL`` (1), ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` (2).

Not supported (reading the name raises ``TritonModelException`` naming it): custom metrics
(``MetricFamily``, ``Metric``, ``MetricKind``), the model loading API (``load_model``,
``unload_model``, ``is_model_ready``), BLS output placement (``PreferredMemory``,
``TRITONSERVER_MEMORY_CPU``, ``TRITONSERVER_MEMORY_GPU``), DLPack (``Tensor.to_dlpack``,
``Tensor.from_dlpack``), request rescheduling and BLS calls into decoupled models.

The worker process plugs itself in through ``set_log_sink``, ``set_bls_executor``,
``InferenceRequest._attach_response_sender`` and ``InferenceRequest._attach_cancellation``;
model code never calls those.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import json
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Final, NoReturn, Protocol

import numpy as np
import numpy.typing as npt

from inferd.datatypes import DATATYPES, serialize_bytes

# auto_complete_config's argument; a name of this module, as in Triton's.
from inferd.python_backend.auto_complete_config import ModelConfig as ModelConfig
from inferd.python_backend.auto_complete_config import tensor_config as _tensor_config

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START: Final = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END: Final = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL: Final = 1
TRITONSERVER_REQUEST_RELEASE_ALL: Final = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: Final = 2

_BYTES_TYPE: Final = DATATYPES["BYTES"].config_type
# Triton's data type codes (TRITONSERVER_DataType, the model config's TYPE_* numbers) with a
# numpy dtype. BF16 has none in numpy (inferd carries it as uint16 elsewhere), so Triton's type
# helpers leave it out and so do these.
_NUMPY_BY_TRITON: Final[dict[int, type[np.generic]]] = {
    row.config_type: (np.object_ if row.is_bytes else row.numpy.type)
    for row in DATATYPES.values()
    if row.name != "BF16"
}
_TRITON_BY_NUMPY: Final[dict[np.dtype[Any], int]] = {
    np.dtype(numpy_type): triton_type
    for triton_type, numpy_type in _NUMPY_BY_TRITON.items()
    if triton_type != _BYTES_TYPE
}


class TritonModelException(Exception):
    """Raised by (and to) model code: fails the load, or the batch, with its message."""

    def message(self) -> str:
        return str(self)


class TritonError:
    """An error carried by an ``InferenceResponse``; ``code`` is a TRITONSERVER_Error_Code."""

    UNKNOWN: ClassVar[int] = 0
    INTERNAL: ClassVar[int] = 1
    NOT_FOUND: ClassVar[int] = 2
    INVALID_ARG: ClassVar[int] = 3
    UNAVAILABLE: ClassVar[int] = 4
    UNSUPPORTED: ClassVar[int] = 5
    ALREADY_EXISTS: ClassVar[int] = 6
    CANCELLED: ClassVar[int] = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if not isinstance(message, str):
            raise TritonModelException(
                f"TritonError message must be a str, got {type(message).__name__}"
            )
        if code not in range(TritonError.UNKNOWN, TritonError.CANCELLED + 1):
            raise TritonModelException(f"TritonError code {code!r} is not a TritonError code")
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


def _unsupported(what: str) -> NoReturn:
    raise TritonModelException(f"{what} is not supported by inferd's python backend")


def _as_bytes(element: object) -> bytes:
    # As Triton serializes BYTES: bytes as they are, anything else as its str in UTF-8.
    if isinstance(element, bytes):
        return element if type(element) is bytes else bytes(element)  # numpy.bytes_ -> bytes
    return str(element).encode("utf-8")


def _bytes_array(data: npt.NDArray[Any]) -> npt.NDArray[np.object_]:
    """``data`` itself when it is already an object array of bytes, else such a copy."""
    if data.dtype == np.object_ and all(type(e) is bytes for e in data.flat):
        return data
    converted = np.empty(data.shape, dtype=np.object_)
    for index, element in np.ndenumerate(data):
        converted[index] = _as_bytes(element)
    return converted


class Tensor:
    """A named tensor of a request or a response; its data is a numpy array on the CPU.

    Numeric data is kept as given (the worker hands model code zero-copy views). BYTES data is
    a numpy object array of ``bytes``: a ``numpy.bytes_`` array, or an object array with
    ``str`` elements, is converted to one. ``numpy.str_`` arrays are refused, as Triton does.
    """

    def __init__(self, name: str, data: npt.ArrayLike) -> None:
        if not isinstance(name, str):
            raise TritonModelException(f"Tensor name must be a str, got {type(name).__name__}")
        array = data if isinstance(data, np.ndarray) else np.asarray(data)
        if array.dtype.kind in ("O", "S"):
            self._triton_dtype = _BYTES_TYPE
            array = _bytes_array(array)
        else:
            triton_dtype = _TRITON_BY_NUMPY.get(array.dtype)
            if triton_dtype is None:
                hint = " (use dtype=np.object_ for strings)" if array.dtype.kind == "U" else ""
                raise TritonModelException(
                    f"Tensor '{name}': numpy dtype {array.dtype} has no Triton data type{hint}"
                )
            self._triton_dtype = triton_dtype
        self._name = name
        self._data = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> npt.NDArray[Any]:
        return self._data

    def triton_dtype(self) -> int:
        """TRITONSERVER_DataType code: 11 for FP32, 13 for BYTES, ..."""
        return self._triton_dtype

    def shape(self) -> list[int]:
        return list(self._data.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> NoReturn:
        _unsupported("Tensor.to_dlpack")

    @staticmethod
    def from_dlpack(*_: object) -> NoReturn:
        _unsupported("Tensor.from_dlpack")

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, triton_dtype={self._triton_dtype})"


class InferenceResponse:
    """One response: output tensors, or an error (its outputs are then ignored)."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | str | None = None,
    ) -> None:
        tensors = [] if output_tensors is None else output_tensors
        if not isinstance(tensors, list | tuple) or not all(isinstance(t, Tensor) for t in tensors):
            raise TritonModelException("InferenceResponse output_tensors must be a list of Tensor")
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(
                f"InferenceResponse error must be a TritonError, got {type(error).__name__}"
            )
        self._output_tensors = list(tensors)
        self._error = error
        self._parameters = _parameters_json(parameters, "InferenceResponse")

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender(Protocol):
    """What ``InferenceRequest.get_response_sender()`` returns to a decoupled model."""

    def send(
        self, response: InferenceResponse | None = None, flags: int = 0
    ) -> None: ...  # pragma: no cover

    def is_cancelled(self) -> bool: ...  # pragma: no cover


def _parameters_json(parameters: dict[str, bool | int | str] | str | None, owner: str) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        return parameters
    if not isinstance(parameters, dict):
        raise TritonModelException(f"{owner} parameters must be a dict")
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"{owner} parameters must map str keys to bool, int or str values; "
                f"{key!r} has a {type(value).__name__}"
            )
    return json.dumps(parameters)


class InferenceRequest:
    """A request: ``execute`` receives a list of them; model code builds them for BLS calls."""

    def __init__(
        self,
        model_name: str,
        inputs: list[Tensor],
        requested_output_names: list[str],
        model_version: int = -1,
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        parameters: dict[str, bool | int | str] | str | None = None,
    ) -> None:
        if not isinstance(model_name, str):
            raise TritonModelException("InferenceRequest model_name must be a str")
        if not isinstance(inputs, list | tuple) or not all(isinstance(t, Tensor) for t in inputs):
            raise TritonModelException("InferenceRequest inputs must be a list of Tensor")
        if not isinstance(requested_output_names, list | tuple) or not all(
            isinstance(n, str) for n in requested_output_names
        ):
            raise TritonModelException(
                "InferenceRequest requested_output_names must be a list of str"
            )
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("InferenceRequest correlation_id must be an int or a str")
        self._model_name = model_name
        self._inputs = list(inputs)
        self._requested_output_names = list(requested_output_names)
        self._model_version = model_version
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = _parameters_json(parameters, "InferenceRequest")
        self._response_sender: InferenceResponseSender | None = None
        # TRITONSERVER_REQUEST_RELEASE_ALL, or RESCHEDULE (read by the worker loop).
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._cancellation: Callable[[], bool] | None = None

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        """Microseconds; 0 is no timeout."""
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON object string (``json.loads`` it)."""
        return self._parameters

    def is_cancelled(self) -> bool:
        """Whether the client cancelled this request while the model runs it (asked of the
        server: a round trip, as in Triton)."""
        return self._cancellation is not None and self._cancellation()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._response_sender is None:
            raise TritonModelException(
                "InferenceRequest.get_response_sender is only for decoupled models "
                "(model_transaction_policy { decoupled: true })"
            )
        return self._response_sender

    def set_release_flags(self, flags: int) -> None:
        """RESCHEDULE: the request comes back in a later execute (an iterative model's,
        sequence_batching { iterative_sequence: true }); its response in execute's list is
        None, or, for a decoupled model, it has sent no final flag (its sender closes when
        execute returns)."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"set_release_flags: unknown flags {flags}")
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        executor = _bls_executor
        if executor is None:
            raise TritonModelException(
                "InferenceRequest.exec is not available: this process has no BLS executor "
                "(model-to-model calls run only inside execute of a served model)"
            )
        return executor(self, decoupled)

    def async_exec(
        self, decoupled: bool = False
    ) -> asyncio.Future[InferenceResponse | Iterator[InferenceResponse]]:
        """An awaitable of what ``exec`` returns; call it from ``async def execute``."""
        if _bls_executor is None:
            raise TritonModelException(
                "InferenceRequest.async_exec is not available: this process has no BLS "
                "executor (model-to-model calls run only inside execute of a served model)"
            )
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, functools.partial(self.exec, decoupled))

    # The worker's side: model code never calls these.
    def _attach_response_sender(self, sender: InferenceResponseSender) -> None:
        self._response_sender = sender

    def _attach_cancellation(self, check: Callable[[], bool]) -> None:
        self._cancellation = check


# Called as executor(request, decoupled) for InferenceRequest.exec/async_exec, from any thread:
# one InferenceResponse, or an iterator of them when decoupled.
BlsExecutor = Callable[[InferenceRequest, bool], InferenceResponse | Iterator[InferenceResponse]]
_bls_executor: BlsExecutor | None = None


def set_bls_executor(executor: BlsExecutor | None) -> None:
    """The worker's hook that runs a BLS request on another model; None removes it."""
    global _bls_executor
    _bls_executor = executor


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The model config's ``input`` entry named ``name`` (its JSON dict), or None."""
    return _tensor_config(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The model config's ``output`` entry named ``name`` (its JSON dict), or None."""
    return _tensor_config(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type: str) -> type[np.generic]:
    """A model config type name ("TYPE_FP32") -> its numpy type; TYPE_STRING -> numpy.object_."""
    name = triton_type.removeprefix("TYPE_")
    row = DATATYPES.get("BYTES" if name == "STRING" else name)
    if name in (triton_type, "BYTES") or row is None or row.config_type not in _NUMPY_BY_TRITON:
        raise TritonModelException(f"{triton_type!r} is not a model config type with a numpy type")
    return _NUMPY_BY_TRITON[row.config_type]


def triton_to_numpy_type(triton_type: int) -> type[np.generic] | None:
    """A TRITONSERVER_DataType code (11) -> its numpy type (numpy.float32); None if it has none."""
    return _NUMPY_BY_TRITON.get(triton_type)


def numpy_to_triton_type(numpy_type: npt.DTypeLike) -> int | None:
    """A numpy type or dtype -> its TRITONSERVER_DataType code; None if it has none."""
    dtype = np.dtype(numpy_type)
    if dtype.kind in ("O", "S"):
        return _BYTES_TYPE
    return _TRITON_BY_NUMPY.get(dtype)


def serialize_byte_tensor(array: npt.NDArray[Any]) -> bytes:
    """A BYTES array -> the protocol's form: each element (C order) as a 4-byte length + bytes."""
    if array.dtype.kind not in ("O", "S"):
        raise TritonModelException(
            f"serialize_byte_tensor takes an object or bytes array, got dtype {array.dtype}"
        )
    return serialize_bytes([_as_bytes(e) for e in array.flat])


def deserialize_bytes_tensor(encoded: bytes) -> npt.NDArray[np.object_]:
    """The protocol's BYTES form -> a 1-D object array of ``bytes``."""
    view = memoryview(encoded)
    elements: list[bytes] = []
    offset = 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise TritonModelException("deserialize_bytes_tensor: truncated element length")
        length = int.from_bytes(view[offset : offset + 4], "little")
        offset += 4
        if offset + length > len(view):
            raise TritonModelException("deserialize_bytes_tensor: element runs past the end")
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    result = np.empty(len(elements), dtype=np.object_)
    result[:] = elements
    return result


def _stderr_sink(level: str, message: str) -> None:
    print(f"{level}: {message}", file=sys.stderr, flush=True)


LogSink = Callable[[str, str], None]  # (level: "INFO" | "WARNING" | "ERROR" | "VERBOSE", message)
_log_sink: LogSink = _stderr_sink


def set_log_sink(sink: LogSink | None) -> None:
    """Where ``Logger`` writes; None restores the default (stderr)."""
    global _log_sink
    _log_sink = _stderr_sink if sink is None else sink


class _LogLevel(enum.Enum):
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    VERBOSE = "VERBOSE"


class Logger:
    """Model code logs through ``pb_utils.Logger.log_info(...)`` and friends (static methods)."""

    LogLevel = _LogLevel
    INFO: ClassVar[_LogLevel] = _LogLevel.INFO
    WARNING: ClassVar[_LogLevel] = _LogLevel.WARNING
    ERROR: ClassVar[_LogLevel] = _LogLevel.ERROR
    VERBOSE: ClassVar[_LogLevel] = _LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: _LogLevel = _LogLevel.INFO) -> None:
        _log_sink(_LogLevel(level).value, str(message))

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, _LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, _LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, _LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, _LogLevel.VERBOSE)


# Names Triton documents that inferd does not implement, each with what it belongs to.
UNSUPPORTED: Final[dict[str, str]] = {
    "MetricFamily": "custom metrics",
    "Metric": "custom metrics",
    "MetricKind": "custom metrics",
    "load_model": "the model loading API",
    "unload_model": "the model loading API",
    "is_model_ready": "the model loading API",
    "PreferredMemory": "BLS output placement",
    "TRITONSERVER_MEMORY_CPU": "BLS output placement",
    "TRITONSERVER_MEMORY_GPU": "BLS output placement",
}

if not TYPE_CHECKING:  # mypy would otherwise accept any attribute of this module

    def __getattr__(name: str) -> object:
        # Raised as TritonModelException, not AttributeError: `from ... import X` would turn an
        # AttributeError into a bare "cannot import name" and lose the reason.
        if name in UNSUPPORTED:
            _unsupported(f"triton_python_backend_utils.{name} ({UNSUPPORTED[name]})")
        raise AttributeError(f"module 'triton_python_backend_utils' has no attribute {name!r}")
