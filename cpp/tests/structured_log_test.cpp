#include "inferd/structured_log.h"

#include <gtest/gtest.h>

#include <string>

namespace inferd {
namespace {

std::string written(const LogRecord& record) {
  ::testing::internal::CaptureStderr();
  record.write();
  return ::testing::internal::GetCapturedStderr();
}

TEST(LogRecord, JsonEscapesWhateverBytesItHolds) {
  set_core_logging(LogLevel::kInfo, /*json=*/true);
  const std::string line = written(LogRecord("a \"quoted\"\nline", LogLevel::kWarning)
                                       .add("path", "C:\\x")
                                       .add("bell", "\a")
                                       .add("bad utf-8", "\xff\xfe ok \xc3\xa9"));
  const std::string expected_start =
      "{\"event\": \"a \\\"quoted\\\"\\nline\", \"level\": \"warning\", \"path\": \"C:\\\\x\", \"bell\": "
      "\"\\u0007\", \"bad utf-8\": \"\\ufffd\\ufffd ok \xc3\xa9\", \"timestamp\": \"";
  EXPECT_EQ(line.rfind(expected_start, 0), 0u) << line;
  EXPECT_EQ(line.substr(line.size() - 4), "Z\"}\n") << line;  // ISO UTC, as structlog's TimeStamper
}

TEST(LogRecord, ConsoleIsOneReadableLine) {
  set_core_logging(LogLevel::kInfo, /*json=*/false);
  const std::string line = written(LogRecord("request failed", LogLevel::kError).add("model", "m"));
  set_core_logging(LogLevel::kInfo, /*json=*/true);
  EXPECT_NE(line.find(" [error    ] request failed model=m\n"), std::string::npos) << line;
}

TEST(LogRecord, LevelsBelowTheMinimumAreNotLogged) {
  set_core_logging(LogLevel::kError, /*json=*/true);
  EXPECT_FALSE(core_logs(LogLevel::kWarning));
  EXPECT_TRUE(core_logs(LogLevel::kError));
  EXPECT_TRUE(core_logs(LogLevel::kCritical));
  set_core_logging(LogLevel::kInfo, /*json=*/true);
  EXPECT_TRUE(core_logs(LogLevel::kInfo));
  EXPECT_FALSE(core_logs(LogLevel::kDebug));
}

}  // namespace
}  // namespace inferd
