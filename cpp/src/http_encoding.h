#pragma once

// HTTP's Content-Encoding and Accept-Encoding for the HTTP transport: gzip and deflate (zlib's
// framing, as tritonclient sends it) through zlib, inflated within a bound.

#include <cstdint>
#include <string>
#include <string_view>

#include "inferd/status.h"

namespace inferd {

enum class HttpEncoding { kIdentity, kGzip, kDeflate };

// The body's Content-Encoding ("" or identity, gzip, deflate); false for any other.
bool parse_content_encoding(std::string_view header, HttpEncoding* out);

// The encoding to answer with for an Accept-Encoding header: gzip or deflate when the client
// accepts one (q > 0; gzip first on a tie), else identity.
HttpEncoding choose_answer_encoding(std::string_view accept_encoding);
const char* encoding_name(HttpEncoding encoding);

// Inflates `in` into `*out`, refusing (INVALID_ARGUMENT: corrupt or truncated; RESOURCE_EXHAUSTED
// naming --http-max-decompressed-bytes) once it would pass `limit` bytes: no more than the limit
// and one zlib window is ever allocated, however the input claims to expand.
Status inflate_body(HttpEncoding encoding, std::string_view in, uint64_t limit, std::string* out);
// Compresses `in` (gzip or deflate) into `*out`; false when it cannot (2 GiB or more: then the
// answer goes uncompressed).
bool deflate_body(HttpEncoding encoding, std::string_view in, std::string* out);

}  // namespace inferd
