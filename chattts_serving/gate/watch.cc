// The admission watch (`chattts_admission`, decoupled): each request is a subscription that
// gets one response at once and one more each time any watched door (`watch_models`, in that
// order) fills or stops being full. A response carries output `full` (BOOL, one per door;
// false for a door whose gate is not loaded) and is never final until the client cancels
// (polled every `cancel_poll_ms`), a gate unloads or the watch itself does. So a front end such
// as the OpenAI gateway knows that the server refuses "busy" without sending a request to learn
// it, and learns within one message that a slot is free again. Between flips the current state
// is sent again every `heartbeat_ms`, so that a subscriber can tell a quiet server from a dead
// connection (and stop trusting a "full" that nobody confirms).
// Ending every subscription when a gate unloads matters (docs/triton-workarounds.md, "watch
// subscriptions at unload"). A subscriber that
// closed its request side, as chattts_serving/client/admission_watch.py does, ends its call at the
// final flag, the model unloads, and the subscriber simply subscribes again (to a restarted
// server). Unloading the watch alone (model control) waits for its subscribers to go.
//
// The gates report to the watch through the Board below (Post, Withdraw, Announce).

#include "watch.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "crash.h"
#include "gate.h"
#include "util.h"

namespace chattts_gate __attribute__((visibility("hidden"))) {

namespace {

// The gates of this server by model name, for the admission watch. Triton loads this library
// once per server, so every model of the backend (each door's gate and the watch) shares it.
struct Board {
  std::mutex mu;
  std::condition_variable changed;
  uint64_t version = 0;                      // bumped whenever a door fills, frees or (un)loads
  uint64_t departures = 0;                   // bumped whenever a gate unloads
  std::map<std::string, const Gate*> gates;  // guarded by mu
};

// Never destroyed: when Triton's exit timeout expires, tritonserver calls exit() while a model
// may still be unloading on another thread, and a static Board would be torn down under that
// thread's ModelFinalize (a segmentation fault in the map's erase, seen at such stops).
Board& TheBoard() {
  static Board* board = new Board();
  return *board;
}

}  // namespace

struct Watch {
  std::vector<std::string> doors;
  std::chrono::microseconds cancel_poll {100000}, heartbeat {5000000};
  std::vector<TRITONBACKEND_ResponseFactory*> fresh;     // subscribed, no response yet; guarded by Board::mu
  bool stopping = false;                                 // guarded by Board::mu
  std::vector<TRITONBACKEND_ResponseFactory*> watchers;  // the worker thread's own
  std::thread worker;

  // false once the subscription is over (the response could not be made or sent).
  bool Send(TRITONBACKEND_ResponseFactory* factory, const std::vector<bool>& full) {
    TRITONBACKEND_Response* response = nullptr;
    if (TRITONSERVER_Error* err = TRITONBACKEND_ResponseNewFromFactory(&response, factory)) {
      TRITONSERVER_ErrorDelete(err);
      return false;
    }
    const int64_t shape[1] = {static_cast<int64_t>(full.size())};
    TRITONBACKEND_Output* output = nullptr;
    void* buf = nullptr;
    TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
    int64_t mid = 0;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(response, &output, "full", TRITONSERVER_TYPE_BOOL, shape, 1);
    if (err == nullptr) err = TRITONBACKEND_OutputBuffer(output, &buf, full.size(), &mtype, &mid);
    if (err == nullptr && mtype == TRITONSERVER_MEMORY_GPU)
      err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "admission watch: output buffer in GPU memory");
    if (err != nullptr) {
      TRITONSERVER_ErrorDelete(err);
      TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseDelete(response));
      return false;
    }
    for (size_t i = 0; i < full.size(); ++i) static_cast<bool*>(buf)[i] = full[i];
    err = TRITONBACKEND_ResponseSend(response, 0, nullptr);
    const bool sent = err == nullptr;
    TRITONSERVER_ErrorDelete(err);
    return sent;
  }

  static void End(TRITONBACKEND_ResponseFactory* factory) {
    TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactorySendFlags(factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
    TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactoryDelete(factory));
  }

  void Run() {
    Board& b = TheBoard();
    std::unique_lock<std::mutex> lk(b.mu);
    uint64_t seen = b.version, seen_departures = b.departures;
    std::vector<bool> full(doors.size(), false);
    auto next_poll = std::chrono::steady_clock::now() + cancel_poll;
    auto next_beat = std::chrono::steady_clock::now() + heartbeat;
    for (;;) {
      b.changed.wait_until(lk, next_poll, [&] { return stopping || b.version != seen || !fresh.empty(); });
      CrashHandler::Ensure();
      const auto now = std::chrono::steady_clock::now();
      const bool beat = now >= next_beat;
      if (beat) next_beat = now + heartbeat;
      const bool changed = b.version != seen || beat;
      seen = b.version;
      for (size_t i = 0; i < doors.size(); ++i) {
        auto it = b.gates.find(doors[i]);
        full[i] = it != b.gates.end() && it->second->live.load() >= it->second->max_live;
      }
      std::vector<TRITONBACKEND_ResponseFactory*> arrived;
      arrived.swap(fresh);
      const bool stop = stopping, departed = b.departures != seen_departures;
      seen_departures = b.departures;
      lk.unlock();
      if (stop || departed) {
        for (auto* f : watchers) End(f);
        for (auto* f : arrived) End(f);
        watchers.clear();
        if (stop) return;
        lk.lock();
        continue;
      }
      const bool poll = now >= next_poll;
      if (poll) next_poll = now + cancel_poll;
      std::vector<TRITONBACKEND_ResponseFactory*> kept;
      for (auto* f : watchers) {
        bool cancelled = false;
        if (poll) TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactoryIsCancelled(f, &cancelled));
        if (cancelled || (changed && !Send(f, full))) {
          End(f);
        } else {
          kept.push_back(f);
        }
      }
      for (auto* f : arrived) {
        if (Send(f, full)) {
          kept.push_back(f);
        } else {
          End(f);
        }
      }
      watchers.swap(kept);
      lk.lock();
    }
  }
};

void Announce() {
  Board& b = TheBoard();
  {
    std::lock_guard<std::mutex> lk(b.mu);
    ++b.version;
  }
  b.changed.notify_all();
}

void Post(const Gate* g) {
  {
    Board& b = TheBoard();
    std::lock_guard<std::mutex> lk(b.mu);
    b.gates[g->name] = g;
  }
  Announce();
}

void Withdraw(const Gate* g) {
  {
    Board& b = TheBoard();
    std::lock_guard<std::mutex> lk(b.mu);
    auto it = b.gates.find(g->name);
    if (it != b.gates.end() && it->second == g) b.gates.erase(it);  // a reload registers its new gate first
    ++b.departures;
  }
  Announce();
}

TRITONSERVER_Error* WatchInitialize(const std::string& json, const std::string& doors, Watch** watch) {
  auto* w = new Watch();
  for (size_t start = 0; start <= doors.size();) {
    size_t comma = doors.find(',', start);
    if (comma == std::string::npos) comma = doors.size();
    if (comma > start) w->doors.push_back(doors.substr(start, comma - start));
    start = comma + 1;
  }
  double poll_ms = std::atof(gate_util::ConfigParameter(json, "cancel_poll_ms", "100").c_str());
  double beat_ms = std::atof(gate_util::ConfigParameter(json, "heartbeat_ms", "5000").c_str());
  if (w->doors.empty() || !(poll_ms > 0) || !(beat_ms > 0)) {
    delete w;
    return Fail("the admission watch needs door names in watch_models, a positive cancel_poll_ms and heartbeat_ms");
  }
  w->cancel_poll = std::chrono::microseconds(static_cast<int64_t>(poll_ms * 1000));
  w->heartbeat = std::chrono::microseconds(static_cast<int64_t>(beat_ms * 1000));
  w->worker = std::thread([w] { w->Run(); });
  *watch = w;
  return nullptr;
}

TRITONSERVER_Error* WatchExecute(Watch* w, TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests,
                                 uint32_t count) {
  const uint64_t exec_start = NowNs();
  std::vector<TRITONBACKEND_ResponseFactory*> factories;
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t start = NowNs();
    TRITONBACKEND_ResponseFactory* factory = nullptr;
    if (TRITONSERVER_Error* err = TRITONBACKEND_ResponseFactoryNew(&factory, requests[i])) {
      TRITONBACKEND_Response* response = nullptr;  // answer the subscriber, which would wait for a report
      if (TRITONBACKEND_ResponseNew(&response, requests[i]) == nullptr) {
        TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err));
      }
      TRITONSERVER_ErrorDelete(err);
      TRITONSERVER_ErrorDelete(TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL));
      continue;
    }
    const uint64_t end = NowNs();
    TRITONSERVER_ErrorDelete(
        TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[i], true, start, start, end, end));
    TRITONSERVER_ErrorDelete(TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL));
    factories.push_back(factory);
  }
  Board& b = TheBoard();
  {
    std::lock_guard<std::mutex> lk(b.mu);
    w->fresh.insert(w->fresh.end(), factories.begin(), factories.end());
  }
  b.changed.notify_all();
  const uint64_t exec_end = NowNs();
  TRITONSERVER_ErrorDelete(
      TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, exec_start, exec_start, exec_end, exec_end));
  return nullptr;
}

void WatchFinalize(Watch* w) {
  Board& b = TheBoard();
  {
    std::lock_guard<std::mutex> lk(b.mu);
    w->stopping = true;
  }
  b.changed.notify_all();
  w->worker.join();  // ends what is left (Triton unloads the watch once no subscription holds it)
  delete w;
}

}  // namespace chattts_gate
