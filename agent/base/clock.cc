#include "agent/base/clock.h"

#include <memory>
#include <random>

#include "absl/synchronization/mutex.h"

namespace sluice {

RandomFn DefaultRandom() {
  auto gen = std::make_shared<std::mt19937_64>(std::random_device{}());
  auto mu = std::make_shared<absl::Mutex>();
  return [gen, mu]() {
    absl::MutexLock lock(mu.get());
    return std::uniform_real_distribution<double>(0.0, 1.0)(*gen);
  };
}

}  // namespace sluice
