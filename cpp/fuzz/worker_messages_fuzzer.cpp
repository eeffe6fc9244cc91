// libFuzzer target for the descriptions a python model's worker writes for the server to read
// (cpp/src/worker_messages.cpp): its answers (decode_responses) and its model-to-model calls
// (decode_call), and the server's writes the worker reads (decode_batch, decode_call_answer). The
// worker is not trusted for memory safety: whatever bytes it writes, decoding must stay within
// them, and what it accepts must lie within the arena it names. Built by -DINFERD_FUZZ=ON with
// clang, ASan and UBSan; run by `make fuzz` and `make fuzz-ci` beside the other fuzzers.
//
// Input: a byte choosing the decoder, 4 bytes of arena size, then the description. The oracle
// aborts when an accepted description names a tensor outside the arena or of a size its shape
// does not have, or when encoding what was accepted and decoding it again gives another result.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/worker_messages.h"

namespace {

using inferd::DataType;
using inferd::worker::BatchDescription;
using inferd::worker::CallAnswerDescription;
using inferd::worker::CallDescription;
using inferd::worker::ResponseDescription;
using inferd::worker::TensorPlace;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "worker_messages_fuzzer: %s\n", what);
    std::abort();
  }
}

void check_places(const std::vector<TensorPlace>& places, size_t arena) {
  for (const TensorPlace& place : places) {
    check(place.offset <= arena && place.nbytes <= arena - place.offset, "a tensor outside the arena was accepted");
    const int64_t count = inferd::element_count(place.shape);
    check(count >= 0, "a tensor of no element count was accepted");
    const size_t width = inferd::element_size(place.dtype);
    if (width != 0) check(static_cast<uint64_t>(count) * width == place.nbytes, "a tensor of the wrong size");
  }
}

bool same_places(const std::vector<TensorPlace>& a, const std::vector<TensorPlace>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].name != b[k].name || a[k].dtype != b[k].dtype || a[k].shape != b[k].shape || a[k].offset != b[k].offset ||
        a[k].nbytes != b[k].nbytes) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const uint8_t which = data[0] % 4;
  uint32_t arena = 0;
  std::memcpy(&arena, data + 1, sizeof arena);
  // A heap copy of exactly the description: reading past it is ASan's to see.
  const std::string bytes(reinterpret_cast<const char*>(data + 5), size - 5);
  const std::string_view view(bytes);
  switch (which) {
    case 0: {
      std::vector<ResponseDescription> responses;
      if (!inferd::worker::decode_responses(view, arena, &responses).ok()) return 0;
      for (const ResponseDescription& response : responses) check_places(response.outputs, arena);
      const std::string encoded = inferd::worker::encode_responses(responses);  // `again` views it
      std::vector<ResponseDescription> again;
      check(inferd::worker::decode_responses(encoded, arena, &again).ok(), "re-encoded responses refused");
      check(again.size() == responses.size(), "re-encoded responses differ");
      for (size_t i = 0; i < again.size(); ++i) {
        check(again[i].ok == responses[i].ok && again[i].error == responses[i].error &&
                  same_places(again[i].outputs, responses[i].outputs),
              "re-encoded responses differ");
      }
      break;
    }
    case 1: {
      CallDescription call;
      if (!inferd::worker::decode_call(view, arena, &call).ok()) return 0;
      check_places(call.inputs, arena);
      const std::string encoded = inferd::worker::encode_call(call);
      CallDescription again;
      check(inferd::worker::decode_call(encoded, arena, &again).ok(), "a re-encoded call refused");
      check(again.model == call.model && again.version == call.version && again.id == call.id &&
                again.chain == call.chain && again.requested_outputs == call.requested_outputs &&
                again.timeout_us == call.timeout_us && again.parameters.size() == call.parameters.size() &&
                same_places(again.inputs, call.inputs),
            "a re-encoded call differs");
      break;
    }
    case 2: {
      BatchDescription batch;
      if (!inferd::worker::decode_batch(view, arena, &batch).ok()) return 0;
      check(batch.cancel_offset <= arena && batch.requests.size() <= arena - batch.cancel_offset,
            "cancellation flags outside the arena were accepted");
      for (const auto& request : batch.requests) check_places(request.inputs, arena);
      break;
    }
    default: {
      CallAnswerDescription answer;
      if (!inferd::worker::decode_call_answer(view, arena, &answer).ok()) return 0;
      check_places(answer.outputs, arena);
      check(static_cast<int>(answer.code) >= 0 && static_cast<int>(answer.code) <= 11, "an unknown status code");
      break;
    }
  }
  return 0;
}
