#pragma once

// Parsing a request's JSON with RapidJSON safely, for the HTTP transport: private to cpp/src.

#include <rapidjson/document.h>

#include <cstddef>

#include "inferd/status.h"

namespace inferd {

// Parses the NUL-terminated `text` (`length` bytes before the NUL) in place into `document`: its
// strings are decoded inside `text` and the Document's strings view it, so `text` must outlive
// `document`'s strings. Iterative (no recursion), and stopped as soon as arrays and objects nest
// deeper than `max_depth` (the document itself is depth 1). The text must be UTF-8 and hold no NUL;
// a string's escapes must decode to UTF-8 (no lone surrogate); numbers are exact: an integer int64
// or uint64 holds stays that integer, any other is the nearest double, and one beyond a double's
// range is refused. INVALID_ARGUMENT naming the byte and the fault (or the depth limit).
// Thread-safe (no shared state); never blocks.
Status parse_json_in_place(char* text, size_t length, size_t max_depth, rapidjson::Document* document);

}  // namespace inferd
