// The admission gate's pure helpers (no Triton call): JSON string literals for its log lines,
// the string parameters of a model config in Triton's JSON form, and the fatal-signal line,
// formatted without allocating. Tested by util_test.cc (tests/unit/test_gate.py builds and runs it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace gate_util {

// A JSON string literal of UTF-8 `s`, ASCII only (\uXXXX escapes, surrogate pairs above the BMP), as
// chattts_serving.serving.logs.event_line writes it. Invalid UTF-8 bytes become U+FFFD.
inline std::string JsonString(const std::string& s) {
  std::string out = "\"";
  char buf[16];
  auto escape = [&](uint32_t cp) {
    if (cp > 0xFFFF) {
      cp -= 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    }
    out += buf;
  };
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c >= 0x20 && c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20) {
      escape(c);
      ++i;
    } else {
      int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
      uint32_t cp = n == 3 ? (c & 0x07) : n == 2 ? (c & 0x0F) : (c & 0x1F);
      bool ok = n > 0 && i + n < s.size();
      for (int k = 1; ok && k <= n; ++k) {
        unsigned char cc = static_cast<unsigned char>(s[i + k]);
        ok = (cc & 0xC0) == 0x80;
        cp = (cp << 6) | (cc & 0x3F);
      }
      if (ok) {
        escape(cp);
        i += n + 1;
      } else {
        escape(0xFFFD);
        ++i;
      }
    }
  }
  return out + "\"";
}

// The string value of model-config parameter `key` in Triton's JSON form of the config
// ("parameters":{"key":{"string_value":"..."}}); `fallback` when absent. Values rendered by
// render.py hold no escaped characters except \" and \\, undone here.
inline std::string ConfigParameter(const std::string& json, const std::string& key, const std::string& fallback) {
  size_t p = json.find("\"parameters\"");
  if (p == std::string::npos) return fallback;
  p = json.find("\"" + key + "\"", p);
  if (p == std::string::npos) return fallback;
  p = json.find("\"string_value\"", p);
  if (p == std::string::npos) return fallback;
  p = json.find('"', p + 14);
  if (p == std::string::npos) return fallback;
  std::string out;
  for (size_t i = p + 1; i < json.size(); ++i) {
    if (json[i] == '\\' && i + 1 < json.size()) {
      out += json[++i];
    } else if (json[i] == '"') {
      return out;
    } else {
      out += json[i];
    }
  }
  return fallback;
}

// "Signal (N) received: chattts gate's fatal-signal handler; tritonserver exits now (stack
// below)\n" in `buf` (`size` bytes, truncated to fit), built without allocating or locking, as
// a signal handler must; returns `buf`. Its "Signal (N)" is what log scanners look for.
inline const char* SignalLine(int sig, char* buf, size_t size) {
  static const char kHead[] = "Signal (";
  static const char kTail[] = ") received: chattts gate's fatal-signal handler; tritonserver exits now (stack below)\n";
  char digits[12];
  int n = 0;
  unsigned v = sig < 0 ? 0u : static_cast<unsigned>(sig);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && n < static_cast<int>(sizeof digits));
  size_t len = 0;
  auto put = [&](char c) {
    if (len + 1 < size) buf[len++] = c;
  };
  for (const char* c = kHead; *c; ++c) put(*c);
  while (n > 0) put(digits[--n]);
  for (const char* c = kTail; *c; ++c) put(*c);
  if (size > 0) buf[len] = '\0';
  return buf;
}

}  // namespace gate_util
