#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "inferd/tensor.h"

namespace inferd::python {

namespace py = pybind11;

// Owns one Python reference from C++ code that may run without the GIL: the reference is taken
// with the GIL held and dropped under a freshly acquired GIL, whichever thread lets go last.
std::shared_ptr<const void> hold_reference(py::handle object);

// Caller's (datatype code, shape, C-contiguous buffer) -> a Tensor viewing the buffer, which is
// kept exported until the tensor's last copy is gone. Requires the GIL. Throws on a bad datatype
// or a non-contiguous buffer; does not check the size (see validate_tensor).
Tensor tensor_from_buffer(int datatype, const py::sequence& shape, const py::handle& buffer);

// A read-only ndarray viewing the tensor (BYTES as its serialized uint8 bytes), sharing its owner.
// Requires the GIL.
py::array array_view(const Tensor& tensor);

// The ndarray an executor expects: array_view for fixed-width types, an object array of bytes
// for BYTES, None for an absent input. Requires the GIL.
py::object executor_array(const Tensor& tensor);

// An executor's output array -> Tensor of `expected` type, holding the array (or, for BYTES, a
// serialized copy). Requires the GIL. Throws std::invalid_argument when the array does not match.
Tensor tensor_from_executor_array(const py::handle& array, DataType expected);

}  // namespace inferd::python
