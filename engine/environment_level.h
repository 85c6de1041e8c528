// The speed paths' switches read from the environment (TRAINERD_HOPPER_GEMM,
// TRAINERD_HOPPER_ROPE, TRAINERD_HOPPER_ATTENTION, TRAINERD_HOPPER_DOWN_LORA): each unset means "the
// engine decides" (its rule for the device and dtype), a digit 0..max_level
// that level, anything else 0 (off). Torch-free.
#pragma once

#include <cstdlib>

namespace trainerd::engine {

// The value of an unset switch: the engine's automatic rule.
constexpr int kAutomaticLevel = -1;

// The environment variable `name` as a level: kAutomaticLevel if unset, the
// digit it holds if it is exactly one of "0".."max_level", else 0.
inline int EnvironmentLevel(const char* name, int max_level) {
  const char* v = std::getenv(name);
  if (v == nullptr) return kAutomaticLevel;
  if (v[0] >= '0' && v[0] <= '9' && v[1] == '\0' && v[0] - '0' <= max_level) return v[0] - '0';
  return 0;
}

}  // namespace trainerd::engine
