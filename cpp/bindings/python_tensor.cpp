#include "python_tensor.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace inferd::python {
namespace {

struct DropReference {
  void operator()(const void* object) const {
    py::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(const_cast<void*>(object)));
  }
};

struct ReleaseBuffer {
  void operator()(Py_buffer* view) const {
    py::gil_scoped_acquire gil;
    PyBuffer_Release(view);
    std::default_delete<Py_buffer>()(view);
  }
};

py::dtype numpy_dtype(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return py::dtype("bool");
    case DataType::kUint8:
      return py::dtype("uint8");
    case DataType::kUint16:
      return py::dtype("uint16");
    case DataType::kUint32:
      return py::dtype("uint32");
    case DataType::kUint64:
      return py::dtype("uint64");
    case DataType::kInt8:
      return py::dtype("int8");
    case DataType::kInt16:
      return py::dtype("int16");
    case DataType::kInt32:
      return py::dtype("int32");
    case DataType::kInt64:
      return py::dtype("int64");
    case DataType::kFp16:
      return py::dtype("float16");
    case DataType::kFp32:
      return py::dtype("float32");
    case DataType::kFp64:
      return py::dtype("float64");
    case DataType::kBf16:
      return py::dtype("uint16");  // numpy has no bfloat16: the raw bits
    case DataType::kBytes:
      return py::dtype("uint8");  // serialized elements
  }
  throw std::invalid_argument("unknown datatype");
}

py::array readonly_view(const py::dtype& dtype, std::vector<py::ssize_t> shape, const Tensor& tensor) {
  // The capsule owns a copy of the tensor's owner and is the array's base: the memory lives as
  // long as the array or any view of it. Ownership of the heap pointer passes to the capsule.
  auto keep = std::make_unique<std::shared_ptr<const void>>(tensor.owner);
  py::capsule base(keep.get(), [](void* p) {
    std::default_delete<std::shared_ptr<const void>>()(static_cast<std::shared_ptr<const void>*>(p));
  });
  keep.release();
  py::array array(dtype, std::move(shape), {}, tensor.data, base);
  py::detail::array_proxy(array.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return array;
}

void append_element(std::vector<std::byte>* out, const char* data, size_t size) {
  if (size > 0xFFFFFFFFu) throw std::invalid_argument("BYTES element longer than 4 GiB");
  const auto len = static_cast<uint32_t>(size);
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<std::byte>((len >> (8 * i)) & 0xFF));
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  out->insert(out->end(), bytes, bytes + size);
}

}  // namespace

std::shared_ptr<const void> hold_reference(py::handle object) {
  return std::shared_ptr<const void>(object.inc_ref().ptr(), DropReference{});
}

Tensor tensor_from_buffer(int datatype, const py::sequence& shape, const py::handle& buffer) {
  if (!is_valid_datatype(datatype)) throw std::invalid_argument("unknown datatype code " + std::to_string(datatype));
  auto view = std::unique_ptr<Py_buffer, ReleaseBuffer>(new Py_buffer);  // NOLINT: filled by CPython
  if (PyObject_GetBuffer(buffer.ptr(), view.get(), PyBUF_C_CONTIGUOUS) != 0) {
    std::default_delete<Py_buffer>()(view.release());
    throw py::error_already_set();
  }
  Tensor tensor;
  tensor.dtype = static_cast<DataType>(datatype);
  for (auto dim : shape) tensor.shape.push_back(dim.cast<int64_t>());
  tensor.data = static_cast<const std::byte*>(view->buf);
  tensor.byte_size = static_cast<size_t>(view->len);
  tensor.owner = std::shared_ptr<Py_buffer>(std::move(view));
  return tensor;
}

py::array array_view(const Tensor& tensor) {
  if (tensor.dtype == DataType::kBytes) {
    return readonly_view(numpy_dtype(tensor.dtype), {static_cast<py::ssize_t>(tensor.byte_size)}, tensor);
  }
  return readonly_view(numpy_dtype(tensor.dtype), {tensor.shape.begin(), tensor.shape.end()}, tensor);
}

py::object executor_array(const Tensor& tensor) {
  if (tensor.absent) return py::none();
  if (tensor.dtype != DataType::kBytes) return array_view(tensor);
  std::vector<size_t> offsets;
  if (!bytes_element_offsets(tensor.data, tensor.byte_size, &offsets)) {
    throw std::invalid_argument("malformed BYTES tensor");
  }
  py::list elements;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const size_t begin = offsets[i] + 4;
    elements.append(py::bytes(reinterpret_cast<const char*>(tensor.data + begin), offsets[i + 1] - begin));
  }
  py::module_ numpy = py::module_::import("numpy");
  py::object flat = numpy.attr("empty")(elements.size(), py::dtype("O"));
  flat[py::slice(0, static_cast<py::ssize_t>(elements.size()), 1)] = elements;
  py::tuple shape(tensor.shape.size());
  for (size_t i = 0; i < tensor.shape.size(); ++i) shape[i] = tensor.shape[i];
  return flat.attr("reshape")(shape);
}

Tensor tensor_from_executor_array(const py::handle& object, DataType expected) {
  py::array array = py::array::ensure(object, py::array::c_style);
  if (!array) throw std::invalid_argument("executor output is not an array");
  Tensor tensor;
  tensor.dtype = expected;
  for (py::ssize_t i = 0; i < array.ndim(); ++i) tensor.shape.push_back(array.shape(i));
  const char kind = array.dtype().kind();
  if (expected == DataType::kBytes) {
    if (kind != 'O' && kind != 'S' && kind != 'U') {
      throw std::invalid_argument(std::string("BYTES output has numpy kind '") + kind + "'");
    }
    auto serialized = std::make_shared<std::vector<std::byte>>();
    py::iterator it = py::iter(array.attr("ravel")());
    for (; it != py::iterator::sentinel(); ++it) {
      py::handle item = *it;
      if (PyBytes_Check(item.ptr())) {
        append_element(serialized.get(), PyBytes_AS_STRING(item.ptr()),
                       static_cast<size_t>(PyBytes_GET_SIZE(item.ptr())));
      } else if (PyUnicode_Check(item.ptr())) {
        Py_ssize_t size = 0;
        const char* utf8 = PyUnicode_AsUTF8AndSize(item.ptr(), &size);
        if (utf8 == nullptr) throw py::error_already_set();
        append_element(serialized.get(), utf8, static_cast<size_t>(size));
      } else {
        throw std::invalid_argument("BYTES output element is neither bytes nor str");
      }
    }
    tensor.data = serialized->data();
    tensor.byte_size = serialized->size();
    tensor.owner = std::move(serialized);
    return tensor;
  }
  const py::dtype want = numpy_dtype(expected);
  const bool same =
      array.dtype().equal(want) || (expected == DataType::kBf16 && array.dtype().itemsize() == 2 && kind != 'f');
  if (!same) {
    throw std::invalid_argument("output has numpy dtype " + py::str(array.dtype()).cast<std::string>() +
                                ", the model declares " + py::str(want).cast<std::string>());
  }
  tensor.data = static_cast<const std::byte*>(array.data());
  tensor.byte_size = static_cast<size_t>(array.nbytes());
  tensor.owner = hold_reference(array);
  return tensor;
}

}  // namespace inferd::python
