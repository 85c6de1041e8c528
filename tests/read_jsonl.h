// Test helper: every line of a JSONL fixture file, parsed (throws on bad JSON,
// which fails the test).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trainerd::testing {

inline std::vector<nlohmann::json> ReadJsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace trainerd::testing
