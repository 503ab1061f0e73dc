// chattts admission gate: a Triton backend (C++, in the server process) in front of a Python
// entry model: `chattts` (decoupled, streams) before `chattts_entry`, `chattts_offline` (one
// response per request) before `chattts_offline_entry`. Nothing here depends on which: every
// response of the target is relayed, the final flag with the last.
//
// Why: a refusal answered by the Python entry model costs two inter-process round trips (the
// request into the stub, the error back through the response sender), one request at a time;
// with every core busy decoding, 136 refusals of a 200-request burst took 0.1 to 0.3 s to come
// out (docs/performance.md, "Where the busy time goes"; docs/triton-workarounds.md, "gate, not
// max_queue_size"). Here "busy" is decided and sent in the server's own process, before any
// Python code runs.
//
// The same holds for chattts_offline, whose Python instances run whole utterances: with all
// their threads busy, refusals of a burst took about 1 s (make bench, busy_p99_s_offline_saturated).
//
// What: each request either takes one of `max_live` slots and is forwarded unchanged (inputs,
// requested outputs, request id, request parameters) to `target_model` through Triton's
// in-process C API, every response of which is copied back onto the client's stream; or it is
// answered at once with `busy_message` (a tagged error, chattts_serving.errors.encode) and the
// final flag. A slot is held until the target's final response. A client's cancellation is
// passed on to the target (polled every `cancel_poll_ms`). Refusals are counted at once in
// `<rejected_metric>{model=<label_model>,reason="busy",stage="gate"}` (tts_rejected_total, the
// Python models' family: same name and help; a label set of its own, since Triton frees a
// counter when any one of the models holding it unloads) and logged as `request_rejected` JSON lines on stderr, the form every model here
// writes, once their burst has settled (`log_settle_ms` without a refusal, at most
// `log_max_wait_ms` after the first): logging does not delay the refusals behind it.
//
// The same library also serves the admission watch (`chattts_admission`, struct Watch): a
// model configured with `watch_models` instead of `target_model`, whose subscribers learn at
// once, and again whenever it changes, whether each door is full, so that a front end (the
// OpenAI gateway) refuses "busy" itself while every slot is taken. Triton loads a backend
// library once per server, so the gates and the watch share its globals (struct Board).
//
// While streams are live a gate pings its target every `ping_interval_ms` (a request with the
// bool parameter `chattts_ping`, answered at once by the target's execute: see
// chattts_serving/triton/compat/pings.py). A ping left unanswered for `stall_timeout_ms` means the
// target stopped working (a stuck stub, a stuck backend thread): the gate ends every stream it
// holds with UNAVAILABLE, answers new requests the same, and with `stop_server_on_stall` asks
// the server to stop (SIGTERM), so that it stops claiming readiness and its supervisor starts a
// fresh one. Nothing else inside the process can end those streams: the model that owns them
// is the one that stopped.
//
// Loaded into tritonserver, the library also replaces Triton's handler of fatal signals (struct
// CrashHandler): after a heap corruption, Triton 2.51's handler blocks forever and leaves a
// server that answers "ready" and serves nothing (docs/triton-workarounds.md, "fatal-signal handler").
//
// Parameters (model config, all strings; rendered by chattts_serving/deploy/render.py):
//   a gate: target_model, max_live, busy_message, label_model, rejected_metric, rejected_help,
//   cancel_poll_ms, log_settle_ms, log_max_wait_ms, ping_input (a required BYTES input of the
//   target, sent empty), ping_interval_ms, stall_timeout_ms (0: no pings), stop_server_on_stall;
//   the watch: watch_models (comma-separated gate names, the order of its output `full`), cancel_poll_ms,
//   heartbeat_ms.
// Built by chattts_serving/deploy/gate.py (g++ -std=c++17 -O2 -shared -fPIC, warnings as errors).

#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "triton_api.h"
#include "util.h"

namespace {

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Fatal signals of the server process: Triton 2.51's own handler can block for good after a
// heap corruption (docs/triton-workarounds.md, "fatal-signal handler"). This handler allocates
// nothing: it writes
// the same first line and a raw stack trace (backtrace_symbols_fd) with write(2), then the
// signal's default action ends the process (a core dump where enabled) and the supervisor
// starts a new one.
struct CrashHandler {
  static void Write(const char* s) {
    size_t n = std::strlen(s);
    while (n > 0) {
      ssize_t w = ::write(STDERR_FILENO, s, n);
      if (w <= 0) return;
      s += w;
      n -= static_cast<size_t>(w);
    }
  }

  static void Handle(int sig) {
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
  static void Ensure() {
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
};

// "2026-12-02T00:55:43.103+00:00": the timestamp form of chattts_serving.serving.logs.
std::string Timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm {};
  gmtime_r(&t, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03d+00:00", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

struct Gate;

// Every door's gate tells the admission watch (struct Watch) when it fills or stops being full.
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
  void Run() {
    std::unique_lock<std::mutex> lk(mu);
    while (!stopping) {
      wake.wait_for(lk, cancel_poll);
      CrashHandler::Ensure();
      WatchTarget();
      for (Stream* s : streams) {
        if (s->cancel_sent || s->factory == nullptr) continue;
        bool cancelled = false;
        TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactoryIsCancelled(s->factory, &cancelled));
        if (cancelled) {
          s->cancel_sent = true;
          TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestCancel(s->inner));
        }
      }
      auto now = std::chrono::steady_clock::now();
      if (!unlogged.empty() && (stopping || now - last_unlogged >= log_settle || now - first_unlogged >= log_max_wait)) {
        std::vector<std::string> ids;
        ids.swap(unlogged);
        lk.unlock();
        WriteRefusals(ids);
        lk.lock();
      }
    }
    std::vector<std::string> ids;
    ids.swap(unlogged);
    lk.unlock();
    WriteRefusals(ids);
  }

  // (Worker thread, Gate::mu held.) Ping the target every ping_interval while streams are live;
  // a ping unanswered for stall_timeout ends every stream (TargetStalled).
  void WatchTarget();
  void TargetStalled();

  void WriteRefusals(const std::vector<std::string>& ids) {
    if (ids.empty()) return;
    std::string ts = Timestamp(), lines;
    std::string tail = ",\"reason\":\"busy\",\"status\":\"busy\",\"message\":" + gate_util::JsonString(busy_message) + "}\n";
    std::string head = "{\"ts\":\"" + ts + "\",\"level\":\"warning\",\"event\":\"request_rejected\",\"model\":" +
                       gate_util::JsonString(label_model) + ",\"stage\":\"gate\",\"request_id\":";
    for (const auto& id : ids) lines += head + gate_util::JsonString(id) + tail;
    std::fwrite(lines.data(), 1, lines.size(), stderr);
    std::fflush(stderr);
  }

  void Forget(Stream* s) {
    if (s->pending.fetch_sub(1) == 1) {
      TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestDelete(s->inner));
      delete s;
    }
  }
};

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

void Announce() {
  Board& b = TheBoard();
  {
    std::lock_guard<std::mutex> lk(b.mu);
    ++b.version;
  }
  b.changed.notify_all();
}

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

// What a model of this backend is: one door's gate, or the admission watch.
struct ModelState {
  Gate* gate = nullptr;
  Watch* watch = nullptr;
};

void SendError(TRITONBACKEND_ResponseFactory* factory, TRITONSERVER_Error_Code code, const std::string& message) {
  TRITONBACKEND_Response* response = nullptr;
  if (TRITONBACKEND_ResponseNewFromFactory(&response, factory) == nullptr) {
    TRITONSERVER_Error* err = TRITONSERVER_ErrorNew(code, message.c_str());
    TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err));
    TRITONSERVER_ErrorDelete(err);
  } else {
    TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactorySendFlags(factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
  }
}

// Response buffers for the target's outputs: host memory, freed once copied to the client's.
TRITONSERVER_Error* Alloc(TRITONSERVER_ResponseAllocator*, const char*, size_t byte_size, TRITONSERVER_MemoryType,
                          int64_t, void*, void** buffer, void** buffer_userp, TRITONSERVER_MemoryType* actual_type,
                          int64_t* actual_type_id) {
  *buffer = byte_size ? std::malloc(byte_size) : nullptr;
  *buffer_userp = nullptr;
  *actual_type = TRITONSERVER_MEMORY_CPU;
  *actual_type_id = 0;
  if (byte_size && *buffer == nullptr) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "gate: out of memory");
  return nullptr;
}

TRITONSERVER_Error* Release(TRITONSERVER_ResponseAllocator*, void* buffer, void*, size_t, TRITONSERVER_MemoryType,
                            int64_t) {
  std::free(buffer);
  return nullptr;
}

// Set parameter `key` (Triton's `type` and `value` pointer) on `target` with the setter of its
// type: request parameters onto the target's request, response parameters onto the client's
// response (setters as lambdas: calls, so the library still binds Triton's symbols lazily).
// BYTES parameters are not forwarded (neither side of ours uses them).
template <typename T, typename SetString, typename SetInt, typename SetBool, typename SetDouble>
TRITONSERVER_Error* CopyParameter(T* target, const char* key, TRITONSERVER_ParameterType type, const void* value,
                                  SetString set_string, SetInt set_int, SetBool set_bool, SetDouble set_double) {
  switch (type) {
    case TRITONSERVER_PARAMETER_STRING:
      return set_string(target, key, static_cast<const char*>(value));
    case TRITONSERVER_PARAMETER_INT:
      return set_int(target, key, *static_cast<const int64_t*>(value));
    case TRITONSERVER_PARAMETER_BOOL:
      return set_bool(target, key, *static_cast<const bool*>(value));
    case TRITONSERVER_PARAMETER_DOUBLE:
      return set_double(target, key, *static_cast<const double*>(value));
    default:
      return nullptr;
  }
}

// Copy one target response's outputs and parameters onto `out`; the first error, else nullptr.
TRITONSERVER_Error* CopyResponse(TRITONSERVER_InferenceResponse* in, TRITONBACKEND_Response* out) {
  uint32_t n = 0;
  if (auto* err = TRITONSERVER_InferenceResponseOutputCount(in, &n)) return err;
  for (uint32_t i = 0; i < n; ++i) {
    const char* name;
    TRITONSERVER_DataType dtype;
    const int64_t* shape;
    uint64_t dims;
    const void* base;
    size_t size;
    TRITONSERVER_MemoryType mtype;
    int64_t mid;
    void* userp;
    if (auto* err = TRITONSERVER_InferenceResponseOutput(in, i, &name, &dtype, &shape, &dims, &base, &size, &mtype,
                                                         &mid, &userp))
      return err;
    TRITONBACKEND_Output* output;
    if (auto* err = TRITONBACKEND_ResponseOutput(out, &output, name, dtype, shape, static_cast<uint32_t>(dims)))
      return err;
    void* buf = nullptr;
    TRITONSERVER_MemoryType otype = TRITONSERVER_MEMORY_CPU;
    int64_t oid = 0;
    if (auto* err = TRITONBACKEND_OutputBuffer(output, &buf, size, &otype, &oid)) return err;
    if (size && otype == TRITONSERVER_MEMORY_GPU)
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "gate: client output buffer in GPU memory");
    if (size) std::memcpy(buf, base, size);
  }
  if (auto* err = TRITONSERVER_InferenceResponseParameterCount(in, &n)) return err;
  for (uint32_t i = 0; i < n; ++i) {
    const char* key;
    TRITONSERVER_ParameterType type;
    const void* value;
    if (auto* err = TRITONSERVER_InferenceResponseParameter(in, i, &key, &type, &value)) return err;
    if (auto* err = CopyParameter(
            out, key, type, value,
            [](auto* t, const char* k, const char* v) { return TRITONBACKEND_ResponseSetStringParameter(t, k, v); },
            [](auto* t, const char* k, int64_t v) { return TRITONBACKEND_ResponseSetIntParameter(t, k, v); },
            [](auto* t, const char* k, bool v) { return TRITONBACKEND_ResponseSetBoolParameter(t, k, v); },
            [](auto* t, const char* k, double v) { return TRITONBACKEND_ResponseSetDoubleParameter(t, k, v); }))
      return err;
  }
  return nullptr;
}

// A response of the target: relayed onto the client's stream unless that stream already got its
// final flag (from the gate: a relay failure, or the target stopped answering). The response
// is deleted here either way. At the target's final response the stream leaves Gate::streams,
// its factory is deleted and its slot given back (if it still holds it).
void OnTargetResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  auto* s = static_cast<Stream*>(userp);
  Gate* g = s->gate;
  const bool final = (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0;
  bool release_slot = false;
  {
    std::lock_guard<std::mutex> sl(s->mu);
    if (!s->client_done && response != nullptr) {
      TRITONBACKEND_Response* out = nullptr;
      if (TRITONBACKEND_ResponseNewFromFactory(&out, s->factory) == nullptr) {
        TRITONSERVER_Error* send = nullptr;
        if (TRITONSERVER_Error* err = TRITONSERVER_InferenceResponseError(response)) {  // the response's
          send = TRITONSERVER_ErrorNew(TRITONSERVER_ErrorCode(err), TRITONSERVER_ErrorMessage(err));
        } else if (TRITONSERVER_Error* cerr = CopyResponse(response, out)) {
          std::string msg = std::string("[internal] gate: relaying a response failed: ") + TRITONSERVER_ErrorMessage(cerr);
          TRITONSERVER_ErrorDelete(cerr);
          // A half-built response cannot be sent: drop it, end the client's stream with the
          // error and ask the target to stop; its later responses are dropped (client_done).
          TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseDelete(out));
          out = nullptr;
          SendError(s->factory, TRITONSERVER_ERROR_INTERNAL, msg);
          s->client_done = true;
          TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestCancel(s->inner));
        }
        if (out != nullptr) {  // consumed by the send, whatever its outcome
          TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseSend(out, final ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0, send));
          if (final) s->client_done = true;
        }
        TRITONSERVER_ErrorDelete(send);
      }
    }
    if (final && !s->client_done) {
      TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactorySendFlags(s->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
      s->client_done = true;
    }
    if (final) {
      release_slot = s->slot_held;
      s->slot_held = false;
    }
  }
  if (response != nullptr) TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceResponseDelete(response));
  if (!final) return;
  {
    std::lock_guard<std::mutex> lk(g->mu);
    g->streams.erase(s);  // from now on the worker thread no longer sees the factory
  }
  TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactoryDelete(s->factory));
  s->factory = nullptr;
  if (release_slot) g->ReleaseSlot();
  g->Forget(s);
}

void OnTargetRelease(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp) {
  auto* s = static_cast<Stream*>(userp);
  // The target no longer reads the inputs: the client's request can go (its response factory stays).
  TRITONSERVER_ErrorDelete(TRITONBACKEND_RequestRelease(s->outer, TRITONSERVER_REQUEST_RELEASE_ALL));
  s->outer = nullptr;
  s->gate->Forget(s);
}

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

// Build the target's request from the client's; on success the Stream owns both.
TRITONSERVER_Error* Forward(Gate* g, TRITONBACKEND_Request* request, Stream* s) {
  const char* id = nullptr;
  if (auto* err = TRITONBACKEND_RequestId(request, &id)) return err;
  if (auto* err = TRITONSERVER_InferenceRequestNew(&s->inner, g->server, g->target.c_str(), -1)) return err;
  TRITONSERVER_InferenceRequest* r = s->inner;
  if (id && *id)
    if (auto* err = TRITONSERVER_InferenceRequestSetId(r, id)) return err;
  uint32_t n = 0;
  if (auto* err = TRITONBACKEND_RequestInputCount(request, &n)) return err;
  for (uint32_t i = 0; i < n; ++i) {
    TRITONBACKEND_Input* input;
    if (auto* err = TRITONBACKEND_RequestInputByIndex(request, i, &input)) return err;
    const char* name;
    TRITONSERVER_DataType dtype;
    const int64_t* shape;
    uint32_t dims, buffers;
    uint64_t size;
    if (auto* err = TRITONBACKEND_InputProperties(input, &name, &dtype, &shape, &dims, &size, &buffers)) return err;
    if (auto* err = TRITONSERVER_InferenceRequestAddInput(r, name, dtype, shape, dims)) return err;
    for (uint32_t b = 0; b < buffers; ++b) {
      const void* base;
      uint64_t bsize;
      TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
      int64_t mid = 0;
      if (auto* err = TRITONBACKEND_InputBuffer(input, b, &base, &bsize, &mtype, &mid)) return err;
      if (auto* err = TRITONSERVER_InferenceRequestAppendInputData(r, name, base, bsize, mtype, mid)) return err;
    }
  }
  if (auto* err = TRITONBACKEND_RequestOutputCount(request, &n)) return err;
  for (uint32_t i = 0; i < n; ++i) {
    const char* name;
    if (auto* err = TRITONBACKEND_RequestOutputName(request, i, &name)) return err;
    if (auto* err = TRITONSERVER_InferenceRequestAddRequestedOutput(r, name)) return err;
  }
  if (auto* err = TRITONBACKEND_RequestParameterCount(request, &n)) return err;
  for (uint32_t i = 0; i < n; ++i) {
    const char* key;
    TRITONSERVER_ParameterType type;
    const void* value;
    if (auto* err = TRITONBACKEND_RequestParameter(request, i, &key, &type, &value)) return err;
    if (auto* err = CopyParameter(
            r, key, type, value,
            [](auto* t, const char* k, const char* v) { return TRITONSERVER_InferenceRequestSetStringParameter(t, k, v); },
            [](auto* t, const char* k, int64_t v) { return TRITONSERVER_InferenceRequestSetIntParameter(t, k, v); },
            [](auto* t, const char* k, bool v) { return TRITONSERVER_InferenceRequestSetBoolParameter(t, k, v); },
            [](auto* t, const char* k, double v) { return TRITONSERVER_InferenceRequestSetDoubleParameter(t, k, v); }))
      return err;
  }
  if (auto* err = TRITONSERVER_InferenceRequestSetReleaseCallback(r, OnTargetRelease, s)) return err;
  if (auto* err = TRITONSERVER_InferenceRequestSetResponseCallback(r, g->allocator, nullptr, OnTargetResponse, s))
    return err;
  {
    std::lock_guard<std::mutex> lk(g->mu);
    g->streams.insert(s);
  }
  if (auto* err = TRITONSERVER_ServerInferAsync(g->server, r, nullptr)) {  // the request is still ours
    std::lock_guard<std::mutex> lk(g->mu);
    g->streams.erase(s);
    return err;
  }
  return nullptr;
}

// A request answered here (not forwarded): statistics, then factory and request released.
void Done(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, TRITONBACKEND_ResponseFactory* factory,
          uint64_t start) {
  const uint64_t end = NowNs();
  TRITONSERVER_ErrorDelete(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, true, start, start, end, end));
  TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactoryDelete(factory));
  TRITONSERVER_ErrorDelete(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
}

TRITONSERVER_Error* Fail(const std::string& msg) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, ("chattts gate: " + msg).c_str());
}

// The admission watch's model (parameter watch_models: comma-separated door names).
TRITONSERVER_Error* WatchInitialize(TRITONBACKEND_Model* model, const std::string& json, const std::string& doors) {
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
  return TRITONBACKEND_ModelSetState(model, new ModelState {nullptr, w});
}

// Subscriptions: each request's factory goes to the watch's worker, which answers it at once
// with the doors' state; the request itself is released here (nothing of it is read).
TRITONSERVER_Error* WatchExecute(Watch* w, TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests,
                                 const uint32_t count) {
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

}  // namespace

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) {
  CrashHandler::Ensure();
  uint32_t major = 0, minor = 0;
  if (auto* err = TRITONBACKEND_ApiVersion(&major, &minor)) return err;
  if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                 ("chattts gate: needs Triton backend API 1." +
                                  std::to_string(TRITONBACKEND_API_VERSION_MINOR) + " or newer 1.x, server has " +
                                  std::to_string(major) + "." + std::to_string(minor))
                                     .c_str());
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  TRITONSERVER_Message* message = nullptr;
  if (auto* err = TRITONBACKEND_ModelConfig(model, 1, &message)) return err;
  const char* base = nullptr;
  size_t size = 0;
  TRITONSERVER_Error* err = TRITONSERVER_MessageSerializeToJson(message, &base, &size);
  std::string json = err ? "" : std::string(base, size);
  TRITONSERVER_ErrorDelete(TRITONSERVER_MessageDelete(message));
  if (err) return err;

  const std::string watch_models = gate_util::ConfigParameter(json, "watch_models", "");
  if (!watch_models.empty()) return WatchInitialize(model, json, watch_models);

  auto* g = new Gate();
  const char* name = nullptr;
  TRITONSERVER_ErrorDelete(TRITONBACKEND_ModelName(model, &name));
  g->name = name ? name : "";
  g->target = gate_util::ConfigParameter(json, "target_model", "");
  g->busy_message = gate_util::ConfigParameter(json, "busy_message", "");
  g->label_model = gate_util::ConfigParameter(json, "label_model", g->name);
  std::string metric = gate_util::ConfigParameter(json, "rejected_metric", "");
  std::string help = gate_util::ConfigParameter(json, "rejected_help", "");
  long max_live = std::atol(gate_util::ConfigParameter(json, "max_live", "0").c_str());
  double poll_ms = std::atof(gate_util::ConfigParameter(json, "cancel_poll_ms", "5").c_str());
  double settle_ms = std::atof(gate_util::ConfigParameter(json, "log_settle_ms", "10").c_str());
  double max_wait_ms = std::atof(gate_util::ConfigParameter(json, "log_max_wait_ms", "100").c_str());
  g->ping_input = gate_util::ConfigParameter(json, "ping_input", "");
  double ping_ms = std::atof(gate_util::ConfigParameter(json, "ping_interval_ms", "5000").c_str());
  double stall_ms = std::atof(gate_util::ConfigParameter(json, "stall_timeout_ms", "0").c_str());
  g->stop_server_on_stall = gate_util::ConfigParameter(json, "stop_server_on_stall", "false") == "true";
  std::string problem = g->target.empty()          ? "parameter target_model is missing"
                        : g->target == g->name     ? "target_model names the gate itself"
                        : g->busy_message.empty()  ? "parameter busy_message is missing"
                        : metric.empty() || help.empty() ? "parameters rejected_metric and rejected_help are required"
                        : max_live < 1             ? "parameter max_live must be a positive integer"
                        : !(poll_ms > 0)           ? "parameter cancel_poll_ms must be positive"
                        : !(settle_ms > 0) || !(max_wait_ms >= settle_ms)
                            ? "parameters log_settle_ms > 0 and log_max_wait_ms >= log_settle_ms required"
                        : !(stall_ms >= 0) || (stall_ms > 0 && (g->ping_input.empty() || !(ping_ms > 0)))
                            ? "parameter stall_timeout_ms > 0 needs ping_input and a positive ping_interval_ms"
                            : "";
  if (!problem.empty()) {
    delete g;
    return Fail(problem);
  }
  g->max_live = static_cast<uint32_t>(max_live);
  g->cancel_poll = std::chrono::microseconds(static_cast<int64_t>(poll_ms * 1000));
  g->log_settle = std::chrono::microseconds(static_cast<int64_t>(settle_ms * 1000));
  g->log_max_wait = std::chrono::microseconds(static_cast<int64_t>(max_wait_ms * 1000));
  g->ping_interval = std::chrono::microseconds(static_cast<int64_t>(ping_ms * 1000));
  g->stall_timeout = std::chrono::microseconds(static_cast<int64_t>(stall_ms * 1000));
  if ((err = TRITONBACKEND_ModelServer(model, &g->server)) ||
      (err = TRITONSERVER_ResponseAllocatorNew(&g->allocator, Alloc, Release, nullptr))) {
    delete g;
    return err;
  }
  // Metrics may be disabled (--allow-metrics=false): the gate then only logs.
  if (TRITONSERVER_Error* merr = TRITONSERVER_MetricFamilyNew(&g->rejected_family, TRITONSERVER_METRIC_KIND_COUNTER,
                                                              metric.c_str(), help.c_str())) {
    TRITONSERVER_ErrorDelete(merr);
    g->rejected_family = nullptr;
  } else {
    const TRITONSERVER_Parameter* labels[3] = {
        TRITONSERVER_ParameterNew("model", TRITONSERVER_PARAMETER_STRING, g->label_model.c_str()),
        TRITONSERVER_ParameterNew("reason", TRITONSERVER_PARAMETER_STRING, "busy"),
        TRITONSERVER_ParameterNew("stage", TRITONSERVER_PARAMETER_STRING, "gate")};
    TRITONSERVER_ErrorDelete(TRITONSERVER_MetricNew(&g->rejected_busy, g->rejected_family, labels, 3));
    for (auto* p : labels) TRITONSERVER_ParameterDelete(const_cast<TRITONSERVER_Parameter*>(p));
  }
  g->worker = std::thread([g] { g->Run(); });
  {
    Board& b = TheBoard();
    std::lock_guard<std::mutex> lk(b.mu);
    b.gates[g->name] = g;
  }
  Announce();
  return TRITONBACKEND_ModelSetState(model, new ModelState {g, nullptr});
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  if (auto* err = TRITONBACKEND_ModelState(model, &state)) return err;
  auto* ms = static_cast<ModelState*>(state);
  Board& b = TheBoard();
  if (Watch* w = ms->watch) {
    {
      std::lock_guard<std::mutex> lk(b.mu);
      w->stopping = true;
    }
    b.changed.notify_all();
    w->worker.join();  // ends what is left (Triton unloads the watch once no subscription holds it)
    delete w;
    delete ms;
    return nullptr;
  }
  Gate* g = ms->gate;
  delete ms;
  {
    std::lock_guard<std::mutex> lk(b.mu);
    auto it = b.gates.find(g->name);
    if (it != b.gates.end() && it->second == g) b.gates.erase(it);  // a reload registers its new gate first
    ++b.departures;
  }
  Announce();
  {
    std::lock_guard<std::mutex> lk(g->mu);
    g->stopping = true;
  }
  g->wake.notify_all();
  g->worker.join();  // Triton finalizes a model after its requests are released: no stream is left
  if (g->rejected_busy) TRITONSERVER_ErrorDelete(TRITONSERVER_MetricDelete(g->rejected_busy));
  if (g->rejected_family) TRITONSERVER_ErrorDelete(TRITONSERVER_MetricFamilyDelete(g->rejected_family));
  TRITONSERVER_ErrorDelete(TRITONSERVER_ResponseAllocatorDelete(g->allocator));
  delete g;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance*) { return nullptr; }

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance*) { return nullptr; }

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  TRITONBACKEND_Model* model = nullptr;
  void* state = nullptr;
  if (auto* err = TRITONBACKEND_ModelInstanceModel(instance, &model)) return err;
  if (auto* err = TRITONBACKEND_ModelState(model, &state)) return err;
  auto* ms = static_cast<ModelState*>(state);
  if (ms->watch != nullptr) return WatchExecute(ms->watch, instance, requests, count);
  Gate* g = ms->gate;
  const uint64_t exec_start = NowNs();
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_Request* request = requests[i];
    const uint64_t start = NowNs();
    TRITONBACKEND_ResponseFactory* factory = nullptr;
    if (TRITONSERVER_Error* err = TRITONBACKEND_ResponseFactoryNew(&factory, request)) {
      // Without a factory there is no way to answer: Triton ends the request with this error.
      TRITONSERVER_ErrorDelete(err);
      TRITONSERVER_ErrorDelete(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
      continue;
    }
    if (g->stalled.load()) {
      SendError(factory, TRITONSERVER_ERROR_UNAVAILABLE, g->stalled_message);
      Done(instance, request, factory, start);
      continue;
    }
    if (!g->TryAcquire()) {
      const char* id = nullptr;
      TRITONSERVER_ErrorDelete(TRITONBACKEND_RequestId(request, &id));
      SendError(factory, TRITONSERVER_ERROR_UNAVAILABLE, g->busy_message);
      g->Refused(id);
      Done(instance, request, factory, start);
      continue;
    }
    // Statistics first: once forwarded, the request may be released on another thread.
    const uint64_t end = NowNs();
    TRITONSERVER_ErrorDelete(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, true, start, start, end, end));
    auto* s = new Stream();
    s->gate = g;
    s->outer = request;
    s->factory = factory;
    if (TRITONSERVER_Error* err = Forward(g, request, s)) {
      std::string msg = std::string("[unavailable] ") + g->target + " cannot take the request: " +
                        TRITONSERVER_ErrorMessage(err);
      TRITONSERVER_ErrorDelete(err);
      if (s->inner) TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestDelete(s->inner));
      delete s;
      g->ReleaseSlot();
      SendError(factory, TRITONSERVER_ERROR_UNAVAILABLE, msg);
      TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactoryDelete(factory));
      TRITONSERVER_ErrorDelete(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
    }
  }
  const uint64_t exec_end = NowNs();
  TRITONSERVER_ErrorDelete(
      TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, exec_start, exec_start, exec_end, exec_end));
  return nullptr;
}

}  // extern "C"
