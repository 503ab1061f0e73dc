// What the admission gate's sources share: a door's gate (struct Gate) and its forwarded
// requests (struct Stream), with the helpers that gate.cc (forwarding and admission),
// target_ping.cc (pings of the target) and watch.cc (the admission watch) all call. The
// namespace is hidden: the library exports Triton's entry points (TRITONBACKEND_*) alone.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "triton_api.h"

namespace chattts_gate __attribute__((visibility("hidden"))) {

inline uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "2026-12-02T00:55:43.103+00:00": the timestamp form of chattts_serving.serving.logs.
std::string Timestamp();

// An INVALID_ARG error "chattts gate: <msg>", for a model config the backend cannot serve.
TRITONSERVER_Error* Fail(const std::string& msg);

// Answer on `factory` with an error of `code` and the final flag (the flag alone when no
// response can be made).
void SendError(TRITONBACKEND_ResponseFactory* factory, TRITONSERVER_Error_Code code, const std::string& message);

// Response buffers for the target's outputs: host memory, freed once copied to the client's.
TRITONSERVER_Error* Alloc(TRITONSERVER_ResponseAllocator*, const char*, size_t byte_size, TRITONSERVER_MemoryType,
                          int64_t, void*, void** buffer, void** buffer_userp, TRITONSERVER_MemoryType* actual_type,
                          int64_t* actual_type_id);
TRITONSERVER_Error* Release(TRITONSERVER_ResponseAllocator*, void* buffer, void*, size_t, TRITONSERVER_MemoryType,
                            int64_t);

struct Gate;

// Every door's gate tells the admission watch (watch.cc) when it fills or stops being full.
void Announce();

// One forwarded request. Freed once both the target's final response and the release of the
// target request have happened (`pending` counts them down).
// Whose is what: `outer` is Triton's until OnTargetRelease releases it (the target reads its
// inputs until then); `factory` is the gate's from Execute until OnTargetResponse deletes it
// after the target's final response (Gate::mu guards its use by the worker thread: a stream is
// in Gate::streams exactly while its factory lives); `inner` is Triton's from ServerInferAsync
// until its release, then deleted by the last Forget.
struct Stream {
  Gate* gate = nullptr;
  TRITONBACKEND_Request* outer = nullptr;  // the client's request: its inputs back the target's
  TRITONBACKEND_ResponseFactory* factory = nullptr;
  TRITONSERVER_InferenceRequest* inner = nullptr;
  std::atomic<int> pending {2};
  bool cancel_sent = false;  // guarded by Gate::mu
  std::mutex mu;             // the two below, and sends on `factory`
  bool client_done = false;  // the client's stream got its final flag: nothing more is sent on `factory`
  bool slot_held = true;     // the stream holds one of the gate's `max_live` slots
};

// A ping's outcome, shared by the gate and the ping's callbacks (which may run after the gate
// is gone, at shutdown).
struct PingState {
  std::atomic<bool> outstanding {false};
  std::atomic<uint64_t> sent_ns {0};
};

struct Gate {
  std::string name, target, busy_message, label_model;
  TRITONSERVER_Server* server = nullptr;
  TRITONSERVER_ResponseAllocator* allocator = nullptr;
  TRITONSERVER_MetricFamily* rejected_family = nullptr;
  TRITONSERVER_Metric* rejected_busy = nullptr;
  uint32_t max_live = 1;
  std::atomic<uint32_t> live {0};
  std::chrono::microseconds cancel_poll {5000}, log_settle {10000}, log_max_wait {100000};
  std::string ping_input;
  std::chrono::microseconds ping_interval {5000000}, stall_timeout {0};  // stall_timeout 0: no pings
  bool stop_server_on_stall = false;
  std::shared_ptr<PingState> ping = std::make_shared<PingState>();
  std::atomic<bool> stalled {false};  // the target stopped answering: every request is refused
  std::string stalled_message;

  std::mutex mu;
  std::condition_variable wake;
  bool stopping = false;
  std::unordered_set<Stream*> streams;  // forwarded, final response not relayed yet
  std::vector<std::string> unlogged;    // request ids of refusals not logged yet
  std::chrono::steady_clock::time_point first_unlogged, last_unlogged;
  std::thread worker;

  bool TryAcquire() {
    uint32_t cur = live.load();
    do {
      if (cur >= max_live) return false;
    } while (!live.compare_exchange_weak(cur, cur + 1));
    if (cur + 1 == max_live) Announce();  // this request took the last slot: the door is full
    return true;
  }

  void ReleaseSlot() {
    if (live.fetch_sub(1) == max_live) Announce();  // the door was full and has a slot again
  }

  void Refused(const char* request_id) {
    if (rejected_busy != nullptr) TRITONSERVER_ErrorDelete(TRITONSERVER_MetricIncrement(rejected_busy, 1.0));
    std::lock_guard<std::mutex> lk(mu);
    auto now = std::chrono::steady_clock::now();
    if (unlogged.empty()) first_unlogged = now;
    last_unlogged = now;
    unlogged.emplace_back(request_id ? request_id : "");
  }

  // The worker thread: passes clients' cancellations on to the target, pings the target while
  // streams are live, and writes the log lines of refusals whose burst has settled.
  void Run();

  // (Worker thread, Gate::mu held; target_ping.cc.) Ping the target every ping_interval while
  // streams are live; a ping unanswered for stall_timeout ends every stream (TargetStalled).
  void WatchTarget();
  void TargetStalled();

  void WriteRefusals(const std::vector<std::string>& ids);

  void Forget(Stream* s) {
    if (s->pending.fetch_sub(1) == 1) {
      TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestDelete(s->inner));
      delete s;
    }
  }
};

}  // namespace chattts_gate
