// Tests of the gate's pure helpers (util.h), built and run by tests/unit/test_gate.py with the same
// compiler flags as the gate. Prints one line per failed check and exits 1 on any.
#include <cstdio>
#include <string>

#include "util.h"

namespace {

int failures = 0;

void Expect(bool ok, const char* what, const std::string& got) {
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s (got %s)\n", what, got.c_str());
  }
}

void Equal(const std::string& got, const std::string& want, const char* what) { Expect(got == want, what, got); }

}  // namespace

int main() {
  using gate_util::ConfigParameter;
  using gate_util::JsonString;
  using gate_util::SignalLine;

  Equal(JsonString("busy"), "\"busy\"", "plain ASCII");
  Equal(JsonString("a\"b\\c"), "\"a\\\"b\\\\c\"", "quote and backslash escaped");
  Equal(JsonString("a\nb\t\x01"), "\"a\\u000ab\\u0009\\u0001\"", "control characters as \\u escapes");
  Equal(JsonString("\xe4\xbd\xa0\xe5\xa5\xbd"), "\"\\u4f60\\u597d\"", "Chinese as \\u escapes");
  Equal(JsonString("\xf0\x9f\x98\x80"), "\"\\ud83d\\ude00\"", "above the BMP: a surrogate pair");
  Equal(JsonString("\xff" "a"), "\"\\ufffda\"", "an invalid byte becomes U+FFFD");
  Equal(JsonString("\xe4\xbd"), "\"\\ufffd\\ufffd\"", "a cut multi-byte sequence: U+FFFD per byte");
  Equal(JsonString(""), "\"\"", "empty");

  const std::string config =
      R"({"name":"chattts","parameters":{"busy_message":{"string_value":"[busy] server \"busy\": 64 streams"},)"
      R"("max_live":{"string_value":"64"},"empty":{"string_value":""}}})";
  Equal(ConfigParameter(config, "max_live", "0"), "64", "a parameter's value");
  Equal(ConfigParameter(config, "busy_message", ""), "[busy] server \"busy\": 64 streams", "escapes undone");
  Equal(ConfigParameter(config, "empty", "x"), "", "an empty value is a value");
  Equal(ConfigParameter(config, "missing", "fallback"), "fallback", "an absent key: the fallback");
  Equal(ConfigParameter(config, "name", "fallback"), "fallback", "a key outside parameters is not one");
  Equal(ConfigParameter("{}", "max_live", "0"), "0", "no parameters at all");
  Equal(ConfigParameter(R"({"parameters":{"cut":{"string_value":"abc)", "cut", "fb"), "fb", "a cut value: the fallback");

  char buf[160];
  Equal(SignalLine(6, buf, sizeof buf),
        "Signal (6) received: chattts gate's fatal-signal handler; tritonserver exits now (stack below)\n",
        "SIGABRT's line");
  Equal(std::string(SignalLine(11, buf, sizeof buf)).substr(0, 12), "Signal (11) ", "two digits");
  char tiny[12];
  Equal(SignalLine(6, tiny, sizeof tiny), "Signal (6) ", "truncated to the buffer, terminated");

  if (failures == 0) std::printf("gate util: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
