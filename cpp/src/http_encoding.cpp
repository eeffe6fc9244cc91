#include "http_encoding.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace inferd {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

bool equals_lowercase(std::string_view text, std::string_view lower) {
  return text.size() == lower.size() && std::equal(text.begin(), text.end(), lower.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == b;
         });
}

// zlib's window bits: gzip's framing (16 + 15), zlib's (15), or either when inflating (32 + 15).
int window_bits(HttpEncoding encoding) { return encoding == HttpEncoding::kGzip ? 31 : 15; }

// Makes room for `size` bytes in `*out`, its contents kept, without its capacity passing `cap`
// (`size` <= `cap`): std::string's own growth doubles, which would allocate up to twice the
// limit. A fresh string's reserve() takes exactly what it is asked for (past its inline 15).
void grow_within(std::string* out, size_t size, size_t cap) {
  if (size <= out->capacity()) return;
  std::string grown;
  grown.reserve(std::min(cap, std::max(size, 2 * out->capacity())));
  grown.append(*out);
  out->swap(grown);
}

// Empties `*out` and gives its memory back (a refused body's bytes are of no use).
void release(std::string* out) { std::string().swap(*out); }

}  // namespace

bool parse_content_encoding(std::string_view header, HttpEncoding* out) {
  header = trim(header);
  if (header.empty() || equals_lowercase(header, "identity")) {
    *out = HttpEncoding::kIdentity;
  } else if (equals_lowercase(header, "gzip") || equals_lowercase(header, "x-gzip")) {
    *out = HttpEncoding::kGzip;
  } else if (equals_lowercase(header, "deflate")) {
    *out = HttpEncoding::kDeflate;
  } else {
    return false;
  }
  return true;
}

HttpEncoding choose_answer_encoding(std::string_view accept_encoding) {
  double gzip_q = 0, deflate_q = 0;
  while (!accept_encoding.empty()) {
    const size_t comma = accept_encoding.find(',');
    std::string_view item = accept_encoding.substr(0, comma);
    accept_encoding = comma == std::string_view::npos ? std::string_view() : accept_encoding.substr(comma + 1);
    double q = 1;
    const size_t semicolon = item.find(';');
    // Its parameters, any of which may be the weight ("gzip;level=1;q=0" refuses gzip).
    std::string_view parameters = semicolon == std::string_view::npos ? std::string_view() : item.substr(semicolon + 1);
    item = item.substr(0, semicolon);
    while (!parameters.empty()) {
      const size_t next = parameters.find(';');
      const std::string_view parameter = trim(parameters.substr(0, next));
      parameters = next == std::string_view::npos ? std::string_view() : parameters.substr(next + 1);
      if (parameter.size() > 2 && (parameter[0] == 'q' || parameter[0] == 'Q') && parameter[1] == '=') {
        q = std::strtod(std::string(parameter.substr(2)).c_str(), nullptr);
      }
    }
    item = trim(item);
    if (equals_lowercase(item, "gzip") || equals_lowercase(item, "x-gzip")) gzip_q = std::max(gzip_q, q);
    if (equals_lowercase(item, "deflate")) deflate_q = std::max(deflate_q, q);
  }
  if (gzip_q > 0 && gzip_q >= deflate_q) return HttpEncoding::kGzip;
  if (deflate_q > 0) return HttpEncoding::kDeflate;
  return HttpEncoding::kIdentity;
}

const char* encoding_name(HttpEncoding encoding) {
  switch (encoding) {
    case HttpEncoding::kGzip:
      return "gzip";
    case HttpEncoding::kDeflate:
      return "deflate";
    case HttpEncoding::kIdentity:
      break;
  }
  return "identity";
}

Status inflate_body(HttpEncoding encoding, std::string_view in, uint64_t limit, std::string* out) {
  out->clear();
  if (encoding == HttpEncoding::kIdentity) {
    out->assign(in);
    return Status::Ok();
  }
  if (in.size() > UINT32_MAX) {
    return Status::Error(StatusCode::kInvalidArgument, "compressed request bodies of 4 GiB or more are not taken");
  }
  z_stream stream{};
  // 32 + 15: zlib or gzip framing, whichever the body has (some clients frame deflate as gzip).
  if (inflateInit2(&stream, 32 + 15) != Z_OK) return Status::Error(StatusCode::kInternal, "zlib: cannot inflate");
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  stream.avail_in = static_cast<uInt>(in.size());
  constexpr size_t kStep = 64 * 1024;
  int result = Z_OK;
  while (result != Z_STREAM_END) {
    if (out->size() >= limit) {
      inflateEnd(&stream);
      release(out);
      return Status::Error(
          StatusCode::kResourceExhausted,
          "the request body inflates past --http-max-decompressed-bytes (" + std::to_string(limit) + " bytes)");
    }
    const size_t room = static_cast<size_t>(std::min<uint64_t>(kStep, limit - out->size()));
    const size_t at = out->size();
    grow_within(out, at + room, static_cast<size_t>(std::min<uint64_t>(limit, SIZE_MAX)));
    out->resize(at + room);
    stream.next_out = reinterpret_cast<Bytef*>(out->data() + at);
    stream.avail_out = static_cast<uInt>(room);
    result = inflate(&stream, Z_NO_FLUSH);
    out->resize(at + room - stream.avail_out);
    if (result == Z_BUF_ERROR && stream.avail_in == 0) result = Z_DATA_ERROR;  // truncated
    if (result != Z_OK && result != Z_STREAM_END && result != Z_BUF_ERROR) {
      inflateEnd(&stream);
      release(out);
      return Status::Error(StatusCode::kInvalidArgument,
                           std::string("the request body is not valid ") + encoding_name(encoding) + " data");
    }
  }
  inflateEnd(&stream);
  return Status::Ok();
}

bool deflate_body(HttpEncoding encoding, std::string_view in, std::string* out_body) {
  if (in.size() > UINT32_MAX / 2) return false;
  z_stream stream{};
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window_bits(encoding), 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return false;
  }
  std::string& out = *out_body;
  out.assign(deflateBound(&stream, static_cast<uLong>(in.size())), '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  stream.avail_in = static_cast<uInt>(in.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  const int result = deflate(&stream, Z_FINISH);
  out.resize(out.size() - stream.avail_out);
  deflateEnd(&stream);
  return result == Z_STREAM_END;
}

}  // namespace inferd
