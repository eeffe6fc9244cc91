#pragma once

#include <string_view>

#include "inferd/tensor.h"

namespace inferd {

// The protocol's name of a datatype ("FP32"); "?" for a value outside the enum. Thread-safe (a
// constant table); never blocks.
const char* datatype_name(DataType dtype);

// The datatype the protocol names `name` ("FP32" -> kFp32), into `out`; false, `out` untouched,
// for an unknown name (names are case-sensitive, as in Triton). Thread-safe; never blocks.
bool datatype_from_name(std::string_view name, DataType* out);

}  // namespace inferd
