// The admission gate's handler of fatal signals (struct CrashHandler), installed in place of
// Triton's: a Triton 2.51 workaround (docs/triton-workarounds.md, "fatal-signal handler").
// Symptom: after a heap corruption tritonserver neither exits nor serves; /v2/health/ready
// answers 200 and no request completes.
// Cause: Triton's ErrorSignalHandler (server src/triton_signal.cc) symbolises its stack trace,
// which allocates, while glibc raised SIGABRT holding the allocator's lock: it blocks for good.
// What we do: CrashHandler::Ensure puts this handler back over Triton's (which registers after
// the models load) on every round of the gates' and the watch's worker threads; the handler
// allocates nothing, writes the same first line and a raw stack trace with write(2), then the
// signal's default action ends the process (a core dump where enabled) and the supervisor
// (chattts_serving/deploy/supervisor.py) starts a new one.
// Shown by: tests/server/test_stalls.py::test_a_heap_corruption_in_the_server_ends_the_process_and_every_stream.
// Delete when: Triton's handler stops allocating (or exits first).
#pragma once

namespace chattts_gate __attribute__((visibility("hidden"))) {

struct CrashHandler {
  // Write `s` to stderr with write(2) only (async-signal-safe).
  static void Write(const char* s);
  // The handler: the signal line, a raw stack trace, then the signal's default action.
  static void Handle(int sig);
  // Install the handler where another one (Triton's) is in place (see crash.cc for when).
  static void Ensure();
};

}  // namespace chattts_gate
