#include "daemon/systemd_notify.h"

#include <time.h>

#include <cstdint>

#include <systemd/sd-daemon.h>

namespace trainerd::daemon {

void SystemdNotifier::Ready() { sd_notify(0, "READY=1"); }

void SystemdNotifier::Status(const std::string& line) {
  if (line == last_status_) return;
  last_status_ = line;
  sd_notify(0, ("STATUS=" + line).c_str());
}

void SystemdNotifier::Watchdog() { sd_notify(0, "WATCHDOG=1"); }

void SystemdNotifier::Reloading() {
  // Type=notify-reload wants MONOTONIC_USEC with RELOADING=1; plain notify accepts it too.
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t usec = static_cast<uint64_t>(ts.tv_sec) * 1000000u + static_cast<uint64_t>(ts.tv_nsec) / 1000u;
  sd_notify(0, ("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec)).c_str());
}

void SystemdNotifier::Stopping() { sd_notify(0, "STOPPING=1"); }

void SystemdNotifier::ExtendTimeout(std::chrono::seconds extra) {
  const auto usec = std::chrono::duration_cast<std::chrono::microseconds>(extra).count();
  sd_notify(0, ("EXTEND_TIMEOUT_USEC=" + std::to_string(usec)).c_str());
}

std::chrono::microseconds SystemdNotifier::WatchdogInterval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0) return std::chrono::microseconds(0);
  return std::chrono::microseconds(usec);
}

}  // namespace trainerd::daemon
