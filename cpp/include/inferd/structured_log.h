#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace inferd {

// Appends `text` as a JSON string: quotes, backslashes and control characters escaped, bytes that
// are not UTF-8 replaced by U+FFFD (the text ends at its first NUL).
void append_json_string(std::string& out, const std::string& text);

// structlog's levels, in order.
enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kCritical = 4 };

// One line on stderr in the shape of inferd's structlog records, for what the core logs on its
// own threads without touching Python (ONNX Runtime's records, requests the transport answers
// INTERNAL): a JSON object {"event", "level", fields..., "timestamp"} (ISO UTC, as structlog's
// TimeStamper writes it), or in the console format a readable "timestamp [level] event k=v" line.
// Strings are escaped whatever bytes they hold (invalid UTF-8 becomes U+FFFD), so the line is
// valid JSON. The whole line goes out in as few write()s as the stream takes (one for a pipe's
// atomic size), so lines of other threads and of Python do not cut into it.
// Not thread-safe itself (one thread builds a record); write() may be called from any thread.
class LogRecord {
 public:
  LogRecord(std::string_view event, LogLevel level) : event_(event), level_(level) {}
  LogRecord& add(std::string_view key, std::string_view value) {
    fields_.emplace_back(key, value);
    return *this;
  }
  // Writes the record; a record that cannot be written (no memory) is lost.
  void write() const noexcept;

 private:
  std::string event_;
  LogLevel level_;
  std::vector<std::pair<std::string, std::string>> fields_;
};

// Python's logging configuration, mirrored for the core's records: the format (JSON or console)
// and the least severe level written. Thread-safe (atomics).
void set_core_logging(LogLevel minimum, bool json);
// Whether records of `level` are written: build one only then.
bool core_logs(LogLevel level);

}  // namespace inferd
