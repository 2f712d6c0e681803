// Reading a Prometheus text exposition in tests.
#ifndef ROLLPACK_TESTING_EXPOSITION_H_
#define ROLLPACK_TESTING_EXPOSITION_H_

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

namespace rollpack {

// "name{labels}" -> value of every sample line of an exposition.
inline std::map<std::string, double> ParseExposition(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_EXPOSITION_H_
