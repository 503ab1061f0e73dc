// The gate's pings of its target and stall detection: a Triton 2.51 workaround
// (docs/triton-workarounds.md, "stuck model, nobody says so").
// Symptom: a stub that hangs (deadlock, freeze) or dies leaves /v2/health/ready at 200; Triton
// does not restart a decoupled model's stub; its streams wait for ever.
// Cause: triton-inference-server/server#8604; python_backend "TODO: Implement restart on
// decoupled" (python_be.cc).
// What we do (here, the gate's part; the entry models' stall watchdog, the supervisor and the
// liveness probe are the rest of the row): while streams are live a gate pings its target every
// `ping_interval_ms` (a request with the bool parameter `chattts_ping`, answered at once by the
// target's execute: chattts_serving/triton/compat/pings.py). A ping left unanswered for
// `stall_timeout_ms` means the target stopped working (a stuck stub, a stuck backend thread):
// the gate ends every stream it holds with UNAVAILABLE, answers new requests the same, and with
// `stop_server_on_stall` asks the server to stop (SIGTERM), so that it stops claiming readiness
// and its supervisor starts a fresh one. Nothing else inside the process can end those
// streams: the model that owns them is the one that stopped.
// Shown by: tests/server/test_stalls.py, tests/server/test_faults.py.
// Delete when: Triton reports a dead or stuck stub in its health and restarts it.

#include <csignal>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "gate.h"
#include "util.h"

namespace chattts_gate __attribute__((visibility("hidden"))) {

namespace {

// A ping to the target (see the file's comment): one empty string as `ping_input` and the bool
// parameter chattts_ping. Its request and responses are freed by its callbacks, which touch
// only the shared PingState (the gate may be gone by then); its responses carry no outputs,
// and its allocator lives as long as the process.
struct Ping {
  std::shared_ptr<PingState> state;
  TRITONSERVER_InferenceRequest* request = nullptr;
  std::atomic<int> pending {2};  // the final response and the release
  bool dead = false;             // answered by the backend for a stub that does not answer

  void Forget() {
    if (pending.fetch_sub(1) == 1) {
      TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestDelete(request));
      delete this;
    }
  }
};

TRITONSERVER_ResponseAllocator* PingAllocator() {
  static TRITONSERVER_ResponseAllocator* allocator = [] {
    TRITONSERVER_ResponseAllocator* a = nullptr;
    TRITONSERVER_ErrorDelete(TRITONSERVER_ResponseAllocatorNew(&a, Alloc, Release, nullptr));
    return a;
  }();
  return allocator;
}

// The target works if it answers the ping, or refuses it as a working model does (its queue is
// full: UNAVAILABLE). An INTERNAL error is the Python backend speaking for a stub that does not
// answer ("Stub process '...' is not healthy."): the ping stays outstanding and the stall
// verdict follows at its time.
void OnPingResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  auto* p = static_cast<Ping*>(userp);
  if (response != nullptr) {
    TRITONSERVER_Error* err = TRITONSERVER_InferenceResponseError(response);  // the response's
    if (err != nullptr && TRITONSERVER_ErrorCode(err) == TRITONSERVER_ERROR_INTERNAL) p->dead = true;
    TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceResponseDelete(response));
  }
  if ((flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) == 0) return;
  if (!p->dead) p->state->outstanding.store(false);
  p->Forget();
}

void OnPingRelease(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp) { static_cast<Ping*>(userp)->Forget(); }

// Send one ping; false when it could not be sent (e.g. the server is stopping).
bool SendPing(Gate* g) {
  static const char kEmptyString[4] = {0, 0, 0, 0};  // BYTES element: uint32 length 0
  const int64_t shape[1] = {1};
  auto* p = new Ping();
  p->state = g->ping;
  TRITONSERVER_Error* err = TRITONSERVER_InferenceRequestNew(&p->request, g->server, g->target.c_str(), -1);
  if (err == nullptr) err = TRITONSERVER_InferenceRequestSetId(p->request, "chattts-gate-ping");
  if (err == nullptr) err = TRITONSERVER_InferenceRequestAddInput(p->request, g->ping_input.c_str(),
                                                                  TRITONSERVER_TYPE_BYTES, shape, 1);
  if (err == nullptr) err = TRITONSERVER_InferenceRequestAppendInputData(p->request, g->ping_input.c_str(), kEmptyString,
                                                                         sizeof kEmptyString, TRITONSERVER_MEMORY_CPU, 0);
  if (err == nullptr) err = TRITONSERVER_InferenceRequestSetBoolParameter(p->request, "chattts_ping", true);
  if (err == nullptr) err = TRITONSERVER_InferenceRequestSetReleaseCallback(p->request, OnPingRelease, p);
  if (err == nullptr) err = TRITONSERVER_InferenceRequestSetResponseCallback(p->request, PingAllocator(), nullptr,
                                                                              OnPingResponse, p);
  if (err == nullptr) {
    g->ping->sent_ns.store(NowNs());
    g->ping->outstanding.store(true);
    err = TRITONSERVER_ServerInferAsync(g->server, p->request, nullptr);
    if (err != nullptr) g->ping->outstanding.store(false);
  }
  if (err != nullptr) {  // never submitted: the request is still ours
    TRITONSERVER_ErrorDelete(err);
    if (p->request != nullptr) TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestDelete(p->request));
    delete p;
    return false;
  }
  return true;
}

}  // namespace

void Gate::WatchTarget() {
  if (stall_timeout.count() == 0 || stalled.load()) return;
  const uint64_t now = NowNs();
  const uint64_t since = now - ping->sent_ns.load();
  if (ping->outstanding.load()) {
    if (since >= static_cast<uint64_t>(stall_timeout.count()) * 1000) TargetStalled();
    return;
  }
  if (!streams.empty() && since >= static_cast<uint64_t>(ping_interval.count()) * 1000) SendPing(this);
}

void Gate::TargetStalled() {
  stalled.store(true);
  const double timeout_s = stall_timeout.count() / 1e6;
  stalled_message = "[unavailable] server unavailable: " + target + " stopped responding (no answer to a ping in " +
                    std::to_string(timeout_s) + " s); the server is restarting";
  size_t ended = 0;
  for (Stream* s : streams) {
    bool release = false;
    {
      std::lock_guard<std::mutex> sl(s->mu);
      if (!s->client_done) {
        SendError(s->factory, TRITONSERVER_ERROR_UNAVAILABLE, stalled_message);
        s->client_done = true;
        ++ended;
      }
      release = s->slot_held;
      s->slot_held = false;
    }
    if (release) ReleaseSlot();
  }
  std::string line = "{\"ts\":\"" + Timestamp() + "\",\"level\":\"error\",\"event\":\"target_unresponsive\",\"model\":" +
                     gate_util::JsonString(label_model) + ",\"stage\":\"gate\",\"target\":" + gate_util::JsonString(target) +
                     ",\"stall_timeout_s\":" + std::to_string(timeout_s) + ",\"streams_ended\":" +
                     std::to_string(ended) + ",\"stopping_server\":" + (stop_server_on_stall ? "true" : "false") + "}\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  if (stop_server_on_stall) std::raise(SIGTERM);  // Triton's graceful stop: readiness false at once
}

}  // namespace chattts_gate
