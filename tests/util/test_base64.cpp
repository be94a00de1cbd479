// Standard base64: RFC 4648's test vectors both ways, bad input refused, and every byte value round-trips.
#include <gtest/gtest.h>

#include <string>

#include "util/base64.h"

namespace beamline {
namespace {

TEST(Base64, EncodesAndDecodesTheRfcVectors) {
  const std::pair<std::string, std::string> vectors[] = {{"f", "Zg=="},     {"fo", "Zm8="},     {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(encode_base64(plain), encoded);
    EXPECT_EQ(decode_base64(encoded), plain);
  }
  EXPECT_EQ(encode_base64(""), "");
}

TEST(Base64, RefusesMalformedText) {
  EXPECT_FALSE(decode_base64("").has_value());
  EXPECT_FALSE(decode_base64("Zm9").has_value());
  EXPECT_FALSE(decode_base64("Zm9*").has_value());
}

TEST(Base64, EveryByteValueRoundTrips) {
  std::string bytes;
  for (int value = 255; value >= 0; --value) bytes += static_cast<char>(value);
  EXPECT_EQ(decode_base64(encode_base64(bytes)), bytes);
}

}  // namespace
}  // namespace beamline
