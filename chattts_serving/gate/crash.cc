// The fatal-signal handler of tritonserver, carried by the gate's library: see crash.h for the
// Triton 2.51 workaround it is (docs/triton-workarounds.md, "fatal-signal handler").

#include "crash.h"

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <mutex>

#include "util.h"

namespace chattts_gate __attribute__((visibility("hidden"))) {

void CrashHandler::Write(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void CrashHandler::Handle(int sig) {
  char line[160];
  Write(gate_util::SignalLine(sig, line, sizeof line));
  void* frames[64];
  int count = backtrace(frames, 64);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  std::signal(sig, SIG_DFL);  // SA_RESETHAND did so already; explicit for raise() below
  std::raise(sig);
}

// Install the handler where another one (Triton's) is in place. Triton registers its own
// after loading the models, i.e. after this library's initialisation, so the gates' and the
// watch's worker threads call this on every round (a sigaction(2) query when nothing changes).
void CrashHandler::Ensure() {
  static std::once_flag warm_once;
  std::call_once(warm_once, [] {
    void* warm[1];
    backtrace(warm, 1);  // loads the unwinder now: its first use may allocate
  });
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE}) {
    struct sigaction now;
    if (sigaction(sig, nullptr, &now) != 0 || now.sa_handler == Handle) continue;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = Handle;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace chattts_gate
