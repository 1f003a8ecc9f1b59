// Two runs' logits compared relative to the logits' scale: the measure of every test that holds
// one backend or mode to another within a tolerance.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvs::test {

// max |a - b| / max |a| over every step's logits (step i's row in a and in b alike).
inline double rel_diff(const std::vector<std::vector<float>>& a,
                       const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double scale = 1e-6, diff = 0;
    for (size_t j = 0; j < a[i].size(); ++j) {
      scale = std::max(scale, std::fabs(static_cast<double>(a[i][j])));
      diff = std::max(diff, std::fabs(static_cast<double>(a[i][j]) - static_cast<double>(b[i][j])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace kvs::test
