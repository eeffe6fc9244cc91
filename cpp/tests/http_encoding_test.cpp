// The HTTP transport's Content-Encoding and Accept-Encoding (http_encoding.h): which encodings are
// taken, which one an answer gets, and inflating within the decompressed-bytes bound (a bomb is
// refused without the body's memory ever passing the bound).
#include "http_encoding.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace inferd {
namespace {

// `in` compressed by zlib itself (not by deflate_body), with `window_bits` choosing the framing:
// 15 zlib, 31 gzip, -15 raw deflate.
std::string zlib_compress(const std::string& in, int window_bits, int level = Z_DEFAULT_COMPRESSION) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, level, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&stream, static_cast<uLong>(in.size())) + 64, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  stream.avail_in = static_cast<uInt>(in.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(out.size() - stream.avail_out);
  deflateEnd(&stream);
  return out;
}

// `in` inflated by zlib itself (either framing), or "<corrupt>".
std::string zlib_inflate(const std::string& in) {
  z_stream stream{};
  EXPECT_EQ(inflateInit2(&stream, 32 + 15), Z_OK);
  std::string out;
  char chunk[16384];
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  stream.avail_in = static_cast<uInt>(in.size());
  int result = Z_OK;
  while (result == Z_OK) {
    stream.next_out = reinterpret_cast<Bytef*>(chunk);
    stream.avail_out = sizeof(chunk);
    result = inflate(&stream, Z_NO_FLUSH);
    out.append(chunk, sizeof(chunk) - stream.avail_out);
  }
  inflateEnd(&stream);
  return result == Z_STREAM_END ? out : "<corrupt>";
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 generator(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(generator() & 0xFF);
  return out;
}

std::string text(size_t n) {
  std::string out;
  while (out.size() < n)
    out += "{\"name\":\"INPUT0\",\"datatype\":\"FP32\",\"data\":[" + std::to_string(out.size()) + "]}";
  out.resize(n);
  return out;
}

TEST(HttpContentEncoding, TakesIdentityGzipAndDeflateInAnyCase) {
  const std::vector<std::pair<std::string, HttpEncoding>> taken{
      {"", HttpEncoding::kIdentity},          {" \t", HttpEncoding::kIdentity},
      {"identity", HttpEncoding::kIdentity},  {"IDENTITY", HttpEncoding::kIdentity},
      {"gzip", HttpEncoding::kGzip},          {"GZip", HttpEncoding::kGzip},
      {" gzip\t", HttpEncoding::kGzip},       {"x-gzip", HttpEncoding::kGzip},
      {"deflate", HttpEncoding::kDeflate},    {"DEFLATE", HttpEncoding::kDeflate},
      {"  deflate ", HttpEncoding::kDeflate},
  };
  for (const auto& [header, expected] : taken) {
    SCOPED_TRACE("'" + header + "'");
    HttpEncoding encoding = HttpEncoding::kIdentity;
    if (expected == HttpEncoding::kIdentity) encoding = HttpEncoding::kGzip;  // must be overwritten
    ASSERT_TRUE(parse_content_encoding(header, &encoding));
    EXPECT_EQ(encoding, expected);
  }
  for (const char* header :
       {"br", "compress", "zstd", "gzip, deflate", "gzip,gzip", "gzipx", "gzi", "x-deflate", "deflate;q=1", "*"}) {
    SCOPED_TRACE(header);
    HttpEncoding encoding = HttpEncoding::kIdentity;
    EXPECT_FALSE(parse_content_encoding(header, &encoding));
  }
}

TEST(HttpAcceptEncoding, ChoosesTheAcceptedEncodingWithTheHighestQ) {
  const std::vector<std::pair<std::string, HttpEncoding>> cases{
      {"", HttpEncoding::kIdentity},
      {"identity", HttpEncoding::kIdentity},
      {"br, zstd", HttpEncoding::kIdentity},
      {"gzip", HttpEncoding::kGzip},
      {"x-gzip", HttpEncoding::kGzip},
      {"GZIP", HttpEncoding::kGzip},
      {"deflate", HttpEncoding::kDeflate},
      {"br, deflate", HttpEncoding::kDeflate},
      // A tie goes to gzip, whichever comes first.
      {"gzip, deflate", HttpEncoding::kGzip},
      {"deflate, gzip", HttpEncoding::kGzip},
      {"deflate;q=0.5, gzip;q=0.5", HttpEncoding::kGzip},
      // The higher q wins.
      {"gzip;q=0.5, deflate", HttpEncoding::kDeflate},
      {"gzip; q=0.8, deflate; q=0.9", HttpEncoding::kDeflate},
      {"deflate;q=0.2, gzip;Q=0.3", HttpEncoding::kGzip},
      {"br;q=1.0, gzip;q=0.001", HttpEncoding::kGzip},
      {" gzip ; q=0.4 ,deflate;q=0.3", HttpEncoding::kGzip},
      // q=0 refuses an encoding.
      {"gzip;q=0", HttpEncoding::kIdentity},
      {"gzip;q=0.000", HttpEncoding::kIdentity},
      {"gzip;q=0, deflate", HttpEncoding::kDeflate},
      {"gzip;q=0, deflate;q=0", HttpEncoding::kIdentity},
      {"deflate;q=0, gzip;q=0", HttpEncoding::kIdentity},
      // The same encoding twice: its best q.
      {"gzip;q=0, gzip;q=0.5", HttpEncoding::kGzip},
      // Other parameters do not refuse it; a q after them still counts.
      {"gzip;level=1", HttpEncoding::kGzip},
      {"gzip;level=1;q=0", HttpEncoding::kIdentity},
      {"gzip;level=1;q=0, deflate;q=0.1", HttpEncoding::kDeflate},
  };
  for (const auto& [header, expected] : cases) {
    SCOPED_TRACE("'" + header + "'");
    EXPECT_EQ(choose_answer_encoding(header), expected);
  }
}

TEST(HttpAcceptEncoding, EncodingNames) {
  EXPECT_STREQ(encoding_name(HttpEncoding::kIdentity), "identity");
  EXPECT_STREQ(encoding_name(HttpEncoding::kGzip), "gzip");
  EXPECT_STREQ(encoding_name(HttpEncoding::kDeflate), "deflate");
}

TEST(HttpDeflateBody, GzipAndDeflateRoundTripThroughZlibAndInflateBody) {
  for (HttpEncoding encoding : {HttpEncoding::kGzip, HttpEncoding::kDeflate}) {
    for (const std::string& in :
         {std::string(), std::string("x"), text(100'000), random_bytes(300'000, 7), std::string(1 << 20, '\0')}) {
      SCOPED_TRACE(std::string(encoding_name(encoding)) + " of " + std::to_string(in.size()) + " bytes");
      std::string compressed;
      ASSERT_TRUE(deflate_body(encoding, in, &compressed));
      ASSERT_GE(compressed.size(), 2u);
      if (encoding == HttpEncoding::kGzip) {
        EXPECT_EQ(static_cast<unsigned char>(compressed[0]), 0x1f);  // gzip's magic
        EXPECT_EQ(static_cast<unsigned char>(compressed[1]), 0x8b);
      } else {
        EXPECT_EQ((static_cast<unsigned>(static_cast<unsigned char>(compressed[0])) << 8 |
                   static_cast<unsigned char>(compressed[1])) %
                      31,
                  0u);                                                   // zlib's header check
        EXPECT_EQ(static_cast<unsigned char>(compressed[0]) & 0x0f, 8);  // deflate
      }
      EXPECT_EQ(zlib_inflate(compressed), in);
      std::string inflated;
      const Status status = inflate_body(encoding, compressed, in.size() + 1, &inflated);
      ASSERT_TRUE(status.ok()) << status.message;
      EXPECT_EQ(inflated, in);
    }
  }
  // Text compresses.
  std::string compressed;
  ASSERT_TRUE(deflate_body(HttpEncoding::kGzip, text(100'000), &compressed));
  EXPECT_LT(compressed.size(), 50'000u);
}

TEST(HttpInflateBody, IdentityIsCopied) {
  std::string out = "stale";
  ASSERT_TRUE(inflate_body(HttpEncoding::kIdentity, "plain", 1, &out).ok());
  EXPECT_EQ(out, "plain");
}

TEST(HttpInflateBody, TakesZlibAndGzipFramingWhicheverWasNamed) {
  const std::string in = text(200'000);
  for (int window_bits : {15, 31}) {
    for (HttpEncoding named : {HttpEncoding::kGzip, HttpEncoding::kDeflate}) {
      SCOPED_TRACE(std::to_string(window_bits) + " as " + encoding_name(named));
      std::string out = "stale";
      const Status status = inflate_body(named, zlib_compress(in, window_bits), 1 << 20, &out);
      ASSERT_TRUE(status.ok()) << status.message;
      EXPECT_EQ(out, in);
    }
  }
}

void expect_refused_as_invalid(HttpEncoding encoding, const std::string& body) {
  std::string out = "stale";
  const Status status = inflate_body(encoding, body, 1 << 20, &out);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << status.message;
  EXPECT_EQ(status.message, std::string("the request body is not valid ") + encoding_name(encoding) + " data");
  EXPECT_TRUE(out.empty());
}

TEST(HttpInflateBody, CorruptBodiesAreInvalidArgument) {
  const std::string good = zlib_compress(text(50'000), 31);
  expect_refused_as_invalid(HttpEncoding::kGzip, "");
  expect_refused_as_invalid(HttpEncoding::kGzip, "not compressed at all");
  expect_refused_as_invalid(HttpEncoding::kDeflate, random_bytes(4096, 1));
  std::string flipped = good;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x55);
  expect_refused_as_invalid(HttpEncoding::kGzip, flipped);
  // A wrong checksum in the trailer.
  std::string bad_crc = good;
  bad_crc[bad_crc.size() - 6] = static_cast<char>(bad_crc[bad_crc.size() - 6] ^ 1);
  expect_refused_as_invalid(HttpEncoding::kGzip, bad_crc);
  // Raw deflate (no zlib or gzip framing) is not what "deflate" means here (tritonclient frames it).
  expect_refused_as_invalid(HttpEncoding::kDeflate, zlib_compress(text(1000), -15));
}

TEST(HttpInflateBody, TruncatedBodiesAreInvalidArgument) {
  for (int window_bits : {15, 31}) {
    const std::string good = zlib_compress(text(100'000), window_bits);
    for (size_t keep : {size_t{1}, size_t{10}, good.size() / 2, good.size() - 4, good.size() - 1}) {
      SCOPED_TRACE(std::to_string(window_bits) + ": " + std::to_string(keep) + " of " + std::to_string(good.size()));
      expect_refused_as_invalid(window_bits == 31 ? HttpEncoding::kGzip : HttpEncoding::kDeflate, good.substr(0, keep));
    }
  }
}

// A body that inflates far past the limit is refused, and the string it was inflating into
// never held much more than the limit.
TEST(HttpInflateBody, ABombIsRefusedWithoutAllocatingPastTheLimit) {
  const std::string bomb = zlib_compress(std::string(size_t{256} << 20, '\0'), 31, Z_BEST_COMPRESSION);
  ASSERT_LT(bomb.size(), 300'000u);  // ~256 MiB of zeros in ~250 KiB
  // Limits that are and are not powers of two (a string's doubling would pass the latter).
  for (uint64_t limit : {uint64_t{1} << 20, uint64_t{600'000}, uint64_t{3'000'001}, uint64_t{65'537}}) {
    SCOPED_TRACE(limit);
    std::string out;
    const Status status = inflate_body(HttpEncoding::kGzip, bomb, limit, &out);
    EXPECT_EQ(status.code, StatusCode::kResourceExhausted) << status.message;
    EXPECT_EQ(status.message,
              "the request body inflates past --http-max-decompressed-bytes (" + std::to_string(limit) + " bytes)");
    EXPECT_TRUE(out.empty());
    EXPECT_LE(out.capacity(), limit) << "the refused body's string grew past the limit";
  }
}

TEST(HttpInflateBody, ABodyOfExactlyTheLimitIsTakenAndOneByteMoreIsNot) {
  for (const std::string& in : {std::string(600'000, 'z'), text(600'000), random_bytes(600'000, 3),
                                std::string(1 << 20, '\0'), std::string(65'536, 'a'), std::string(1, 'a')}) {
    for (HttpEncoding encoding : {HttpEncoding::kGzip, HttpEncoding::kDeflate}) {
      SCOPED_TRACE(std::string(encoding_name(encoding)) + " of " + std::to_string(in.size()) + " bytes");
      std::string compressed;
      ASSERT_TRUE(deflate_body(encoding, in, &compressed));
      std::string out;
      Status status = inflate_body(encoding, compressed, in.size(), &out);
      ASSERT_TRUE(status.ok()) << status.message;
      EXPECT_EQ(out, in);
      EXPECT_LE(out.capacity(), in.size() + 15) << "the body's string grew past the limit";
      status = inflate_body(encoding, compressed, in.size() - 1, &out);
      EXPECT_EQ(status.code, StatusCode::kResourceExhausted) << status.message;
      EXPECT_TRUE(out.empty());
    }
  }
}

}  // namespace
}  // namespace inferd
