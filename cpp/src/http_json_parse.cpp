// RapidJSON's iterative reader, forwarding to a Document through a handler that bounds the
// nesting and converts numbers itself.
#include "http_json_parse.h"

#include <rapidjson/error/en.h>
#include <rapidjson/reader.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "inferd/infer_request_parser.h"
#include "request_messages.h"

namespace inferd {
namespace {

using rapidjson::Document;
using rapidjson::SizeType;
using request_messages::invalid;

// In place: the JSON's strings are decoded inside the text and viewed from there. The text is
// checked to be UTF-8 before the parse, not by the reader (kParseValidateEncodingFlag): RapidJSON
// 1.1.0's check reads past the end of the text when it ends inside a multi-byte sequence (found
// by http_request_fuzzer; cpp/fuzz/http-corpus/crash-rapidjson-utf8-past-the-end). Numbers come
// as their text (RawNumber) and are converted by std::from_chars, correctly rounded: RapidJSON
// 1.1.0's own full-precision conversion is undefined behaviour for a zero with a large exponent
// ("0e-300": clz of 0), and its default one is not exact.
constexpr unsigned kParseFlags =
    rapidjson::kParseIterativeFlag | rapidjson::kParseInsituFlag | rapidjson::kParseNumbersAsStringsFlag;

// Forwards the reader's events to a Document, stopping the parse once arrays and objects nest
// deeper than `max_depth`: a body of 100,000 nested arrays costs 65 values, not 100,000. After a
// false return, the flag set says why (none set: the Document's own refusal). Not thread-safe:
// one per parse.
class DepthLimitedHandler {
 public:
  DepthLimitedHandler(Document* document, size_t max_depth) : document_(document), max_depth_(max_depth) {}
  bool exceeded() const { return exceeded_; }
  // A string whose escapes decode to what UTF-8 cannot hold (a lone surrogate, "\udc00"): the
  // reader validates the bytes it reads, not the code points it decodes.
  bool not_utf8() const { return not_utf8_; }
  bool out_of_range() const { return out_of_range_; }

  bool Null() { return document_->Null(); }
  bool Bool(bool b) { return document_->Bool(b); }
  bool Int(int i) { return document_->Int(i); }
  bool Uint(unsigned i) { return document_->Uint(i); }
  bool Int64(int64_t i) { return document_->Int64(i); }
  bool Uint64(uint64_t i) { return document_->Uint64(i); }
  bool Double(double d) { return document_->Double(d); }
  // A number's text, as the reader checked it (-?int(.frac)?([eE][+-]?digits)?): an integer
  // that int64 or uint64 holds as that, any other as the nearest double, as RapidJSON's own
  // events would give it. Past a double's range (either way) the parse stops.
  bool RawNumber(const char* str, SizeType length, bool) {
    const char* end = str + length;
    if (std::find_if(str, end, [](char c) { return c == '.' || c == 'e' || c == 'E'; }) == end) {
      if (*str == '-') {
        int64_t i = 0;
        const auto result = std::from_chars(str, end, i);
        if (result.ec == std::errc() && result.ptr == end) return document_->Int64(i);
      } else {
        uint64_t u = 0;
        const auto result = std::from_chars(str, end, u);
        if (result.ec == std::errc() && result.ptr == end) return document_->Uint64(u);
      }
    }
    double d = 0;
    const auto result = std::from_chars(str, end, d);
    out_of_range_ = result.ec != std::errc() || result.ptr != end;
    return !out_of_range_ && document_->Double(d);
  }
  bool String(const char* str, SizeType length, bool copy) {
    return utf8(str, length) && document_->String(str, length, copy);
  }
  bool Key(const char* str, SizeType length, bool copy) {
    return utf8(str, length) && document_->Key(str, length, copy);
  }
  bool StartObject() { return enter() && document_->StartObject(); }
  bool EndObject(SizeType members) {
    --depth_;
    return document_->EndObject(members);
  }
  bool StartArray() { return enter() && document_->StartArray(); }
  bool EndArray(SizeType elements) {
    --depth_;
    return document_->EndArray(elements);
  }

 private:
  bool utf8(const char* str, SizeType length) {
    not_utf8_ = !is_valid_utf8(std::string_view(str, length));
    return !not_utf8_;
  }
  bool enter() {
    if (++depth_ > max_depth_) exceeded_ = true;
    return !exceeded_;
  }
  Document* document_;
  size_t max_depth_;
  size_t depth_ = 0;
  bool exceeded_ = false;
  bool not_utf8_ = false;
  bool out_of_range_ = false;
};

}  // namespace

Status parse_json_in_place(char* text, size_t length, size_t max_depth, Document* document) {
  if (!is_valid_utf8(std::string_view(text, length))) return invalid("malformed JSON: the text is not UTF-8");
  rapidjson::InsituStringStream stream(text);
  DepthLimitedHandler handler(document, max_depth);
  rapidjson::Reader reader;
  rapidjson::ParseResult result;
  auto generate = [&](Document&) {
    result = reader.Parse<kParseFlags>(stream, handler);
    return !result.IsError();
  };
  document->Populate(generate);
  if (handler.exceeded()) {
    return invalid("the request's JSON nests arrays and objects deeper than " + std::to_string(max_depth) +
                   " (--http-max-json-depth)");
  }
  if (handler.not_utf8()) {
    return invalid("malformed JSON at byte " + std::to_string(result.Offset()) +
                   ": a string's escapes decode to text that is not UTF-8 (a lone surrogate)");
  }
  if (handler.out_of_range()) {
    return invalid("malformed JSON at byte " + std::to_string(result.Offset()) +
                   ": a number beyond what a double holds (too large or too small)");
  }
  if (result.IsError()) {
    return invalid(std::string("malformed JSON at byte ") + std::to_string(result.Offset()) + ": " +
                   rapidjson::GetParseError_En(result.Code()));
  }
  // The reader stops at a NUL byte as at the end of the text.
  if (stream.Tell() != length) {
    return invalid("malformed JSON at byte " + std::to_string(stream.Tell()) + ": a NUL byte in the JSON");
  }
  return Status::Ok();
}

}  // namespace inferd
