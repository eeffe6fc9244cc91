#include "inferd/structured_log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace inferd {
namespace {

std::atomic<LogLevel> minimum_level{LogLevel::kInfo};  // until Python's configuration says otherwise
std::atomic<bool> json_format{true};

// Length of the valid UTF-8 sequence starting at s (1-4), or 0 when it is not one.
size_t utf8_sequence(const unsigned char* s) {
  const unsigned char c = s[0];
  size_t length;
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
  } else {
    return 0;
  }
  for (size_t i = 1; i < length; ++i) {
    if ((s[i] & 0xC0) != 0x80) return 0;  // also stops at the terminating NUL
  }
  if (c == 0xE0 && s[1] < 0xA0) return 0;   // overlong
  if (c == 0xED && s[1] >= 0xA0) return 0;  // surrogate
  if (c == 0xF0 && s[1] < 0x90) return 0;   // overlong
  if (c == 0xF4 && s[1] >= 0x90) return 0;  // beyond U+10FFFF
  return length;
}

// As structlog's TimeStamper(fmt="iso", utc=True) writes it: 2026-01-31T12:34:56.123456Z.
std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[96];  // room for any int in each field: no truncation warning
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(micros % 1000000));
  return text;
}

// Writes the whole line with as few write()s as the stream takes (one, for a line of a pipe's
// atomic size or a terminal), so that lines of other threads and of Python do not cut into it.
void write_line(const std::string& line) {
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t written = ::write(STDERR_FILENO, data, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere to report it
    }
    data += written;
    left -= static_cast<size_t>(written);
  }
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kCritical:
      return "critical";
  }
  return "error";
}

}  // namespace

// `text` as a JSON string: quotes, backslashes and control characters escaped, bytes that are not
// UTF-8 replaced by U+FFFD, so that the line is valid JSON whatever ORT puts in a message.
void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  const auto* s = reinterpret_cast<const unsigned char*>(text.c_str());  // NUL-terminated
  while (*s != 0) {
    const unsigned char c = *s;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++s;
    } else if (c == '\n') {
      out += "\\n";
      ++s;
    } else if (c < 0x20 || c == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
      ++s;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++s;
    } else if (size_t length = utf8_sequence(s); length > 0) {
      out.append(reinterpret_cast<const char*>(s), length);
      s += length;
    } else {
      out += "\\ufffd";
      ++s;
    }
  }
  out += '"';
}

void LogRecord::write() const noexcept {
  try {
    std::string line;
    line.reserve(256);
    if (json_format.load(std::memory_order_relaxed)) {
      line += "{\"event\": ";
      append_json_string(line, event_);
      line += ", \"level\": \"";
      line += level_name(level_);
      line += '"';
      for (const auto& [key, value] : fields_) {
        line += ", ";
        append_json_string(line, key);
        line += ": ";
        append_json_string(line, value);
      }
      line += ", \"timestamp\": \"" + utc_timestamp() + "\"}\n";
    } else {
      char level[32];
      std::snprintf(level, sizeof level, "%-9s", level_name(level_));
      line += utc_timestamp() + " [" + level + "] " + event_;
      for (const auto& [key, value] : fields_) line += " " + key + "=" + value;
      line += '\n';
    }
    write_line(line);
  } catch (...) {  // std::bad_alloc: the record is lost
  }
}

void set_core_logging(LogLevel minimum, bool json) {
  minimum_level.store(minimum, std::memory_order_relaxed);
  json_format.store(json, std::memory_order_relaxed);
}

bool core_logs(LogLevel level) { return level >= minimum_level.load(std::memory_order_relaxed); }

}  // namespace inferd
