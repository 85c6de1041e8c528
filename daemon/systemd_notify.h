// trainerd's messages to systemd (sd_notify(3)) for Type=notify: READY=1,
// STATUS=..., WATCHDOG=1, RELOADING=1, STOPPING=1, EXTEND_TIMEOUT_USEC=...
// Each is a no-op when trainerd was not started by systemd ($NOTIFY_SOCKET unset).
#pragma once

#include <chrono>
#include <string>

namespace trainerd::daemon {

class SystemdNotifier {
 public:
  void Ready();                             // the queue is loaded and the socket listens
  void Status(const std::string& line);     // shown by `systemctl status`; sent only when it changed
  void Watchdog();                          // "still alive", at least every WatchdogSec
  void Reloading();                         // SIGHUP: re-reading the config (Ready() follows)
  void Stopping();                          // shutting down
  // Asks for `extra` more time to stop (or start) from now: while workers checkpoint.
  void ExtendTimeout(std::chrono::seconds extra);

  // The interval systemd expects WATCHDOG=1 at ($WATCHDOG_USEC for this
  // process); zero when the watchdog is off.
  static std::chrono::microseconds WatchdogInterval();

 private:
  std::string last_status_;
};

}  // namespace trainerd::daemon
