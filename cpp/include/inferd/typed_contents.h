#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// The InferTensorContents field number that carries `dtype`'s values (bool_contents = 1 ...
// bytes_contents = 8); 0 for a datatype with none (FP16, BF16: raw_input_contents only).
// Thread-safe; never blocks.
uint32_t contents_field(DataType dtype);

// The protocol's name of an InferTensorContents field ("fp32_contents"); "" for 0 and
// "unknown contents field" past 8. Thread-safe; never blocks.
const char* contents_field_name(uint32_t field);

// Decodes `input`'s typed contents (InferTensorContents) as `dtype` into `buffer`: the datatype's
// little-endian bytes, or for BYTES its serialized form (each element a 4-byte little-endian
// length, then its bytes). `elements` is the element count of `shape` (the input's, already
// checked); `where` ("input 'X' of model 'M'") begins the messages. Values are counted before
// `buffer` is sized, and the count stops one past `elements`: a request cannot make it allocate
// more than its shape holds, nor walk more values than that however many it sent. Every value of
// a narrow integer type must fit it. Thread-safe (reads `input` only); never blocks.
// INVALID_ARGUMENT: no typed field for `dtype`, another datatype's field, malformed contents, a
// count that does not match the shape, a value out of range.
Status typed_contents(const WireInput& input, DataType dtype, const std::string& where, int64_t elements,
                      const std::vector<int64_t>& shape, std::vector<std::byte>* buffer);

}  // namespace inferd
