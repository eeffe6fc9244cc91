#include "inferd/datatype_names.h"

namespace inferd {

const char* datatype_name(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return "BOOL";
    case DataType::kUint8:
      return "UINT8";
    case DataType::kUint16:
      return "UINT16";
    case DataType::kUint32:
      return "UINT32";
    case DataType::kUint64:
      return "UINT64";
    case DataType::kInt8:
      return "INT8";
    case DataType::kInt16:
      return "INT16";
    case DataType::kInt32:
      return "INT32";
    case DataType::kInt64:
      return "INT64";
    case DataType::kFp16:
      return "FP16";
    case DataType::kFp32:
      return "FP32";
    case DataType::kFp64:
      return "FP64";
    case DataType::kBytes:
      return "BYTES";
    case DataType::kBf16:
      return "BF16";
  }
  return "?";
}

bool datatype_from_name(std::string_view name, DataType* out) {
  for (int code = 1; code <= 14; ++code) {
    if (name == datatype_name(static_cast<DataType>(code))) {
      *out = static_cast<DataType>(code);
      return true;
    }
  }
  return false;
}

}  // namespace inferd
