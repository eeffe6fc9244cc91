#include "inferd/serving_snapshot.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/version_routing.h"

namespace inferd {
namespace {

std::shared_ptr<const ModelRoute> route_of(const std::string& version) {
  auto route = std::make_shared<ModelRoute>();
  route->model = "canary";
  route->version = version;
  return route;
}

// canary: versions 3, 4, 5 routed; "" (metadata's default) is 5; weights 3:90, 4:10.
ServingSnapshot canary_snapshot() {
  ServingSnapshot snapshot;
  for (const std::string version : {"3", "4", "5"}) snapshot.models["canary"][version] = route_of(version);
  snapshot.models["canary"][""] = snapshot.models["canary"]["5"];
  snapshot.weighted.emplace(
      "canary", ServingSnapshot::WeightedVersions{WeightedChoice({90, 10}),
                                                  {snapshot.models["canary"]["3"], snapshot.models["canary"]["4"]}});
  return snapshot;
}

std::vector<WireParameter> key_parameter(std::string_view key) {
  WireParameter parameter;
  parameter.key = kRoutingKeyParameter;
  parameter.kind = WireParameter::Kind::kString;
  parameter.string_value = key;
  return {parameter};
}

// The route of an unnamed inference whose routing key is `key`, as the transports take it.
std::optional<std::string_view> key_of(const std::vector<WireParameter>& parameters) {
  std::optional<std::string_view> key;
  EXPECT_TRUE(routing_key(parameters, &key).ok());
  return key;
}

TEST(ServingSnapshot, AnUnnamedInferenceWithAKeyTakesTheKeysWeightedVersion) {
  const ServingSnapshot snapshot = canary_snapshot();
  for (int i = 0; i < 200; ++i) {
    const std::string key = "user-" + std::to_string(i);
    const std::string expected = fnv1a64(key) % 100 < 90 ? "3" : "4";
    for (int repeat = 0; repeat < 3; ++repeat)
      EXPECT_EQ(snapshot.find("canary", "", key_of(key_parameter(key)))->version, expected);
  }
}

TEST(ServingSnapshot, AnUnnamedInferenceWithoutAKeyNeverTakesAnUnweightedVersion) {
  const ServingSnapshot snapshot = canary_snapshot();
  int fours = 0;
  for (int i = 0; i < 10000; ++i) {
    const std::string version = snapshot.find("canary", "", std::nullopt)->version;
    ASSERT_NE(version, "5");
    fours += version == "4" ? 1 : 0;
  }
  // Binomial(10000, 0.1): sigma 30; 5 sigma either side of 1000.
  EXPECT_NEAR(fours, 1000, 150);
}

TEST(ServingSnapshot, ANamedVersionAndMetadataBypassTheWeights) {
  const ServingSnapshot snapshot = canary_snapshot();
  EXPECT_EQ(snapshot.find("canary", "5", key_of(key_parameter("user-1")))->version, "5");
  EXPECT_EQ(snapshot.find("canary", "")->version, "5");  // ModelMetadata/ModelConfig's default
}

TEST(ServingState, SettleWaitsForTheReadingsOfEarlierSnapshotsOnly) {
  using namespace std::chrono_literals;
  ServingState state;
  EXPECT_TRUE(state.settle(0ms));  // nothing read
  std::optional<ServingState::Reading> old_reading(state.read());
  const auto old_snapshot = old_reading->snapshot();
  state.publish(std::make_shared<const ServingSnapshot>());
  ServingState::Reading new_reading = state.read();  // of the new snapshot: settle does not wait for it
  EXPECT_NE(new_reading.snapshot(), old_snapshot);
  EXPECT_FALSE(state.settle(50ms));  // a call that read the old one may still submit by it
  auto settled = std::async(std::launch::async, [&state] { return state.settle(5000ms); });
  EXPECT_EQ(settled.wait_for(100ms), std::future_status::timeout);
  old_reading.reset();  // that call submitted
  ASSERT_EQ(settled.wait_for(2s), std::future_status::ready);
  EXPECT_TRUE(settled.get());
}

TEST(RoutingKey, AKeyThatIsNotAStringIsInvalid) {
  std::vector<WireParameter> parameters = key_parameter("");
  parameters[0].kind = WireParameter::Kind::kInt64;
  std::optional<std::string_view> key = "stale";
  const Status status = routing_key(parameters, &key);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message, "the parameter 'inferd.routing_key' must be a string");
  EXPECT_FALSE(key.has_value());
}

TEST(RoutingKey, NoKeyIsNone) {
  std::optional<std::string_view> key = "stale";
  EXPECT_TRUE(routing_key({}, &key).ok());
  EXPECT_FALSE(key.has_value());
}

}  // namespace
}  // namespace inferd
