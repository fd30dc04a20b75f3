"""The C++ agent's source, built on first use (see the comment below)."""

# ---------------------------------------------------------------- the agent
#
# Built with torch.utils.cpp_extension.load_inline on first use (cached by torch
# in its extensions directory) from two parts:
# - AGENT_CORE_SOURCE: standard C++17 only (the ring, the JSON encoder, the stack
#   interner, the batch). python/tests/test_agent_core.py compiles it with g++
#   and a driver, runs it, and checks its bytes against PROTOCOL.md.
# - AGENT_TORCH_SOURCE: the tracker callback, the RecordFunction marker, and the
#   pybind11 functions the helper calls. Written against PyTorch 2.5-2.11's
#   c10/cuda/CUDACachingAllocator.h (TraceEntry's action_, device_, addr_,
#   context_, stream_, size_; attachAllocatorTraceTracker),
#   torch/csrc/profiler/combined_traceback.h (CapturedTraceback, symbolize,
#   unwind::Frame's filename/funcname/lineno), ATen/record_function.h and
#   pybind11 (bytes, int_, gil_scoped_release, the stl casters for the vector of
#   pairs and of tuples that encode() and intern() take).
# Built and run against PyTorch 2.11.0+cu130 on an H100 (python/gpu/live_check.py,
# 2026-11-26: every entry, no loss, each state placed exactly). CI checks the torch
# part only with g++ -fsyntax-only against the stub headers in
# python/tests/agent_stubs/, which declare that API as described above. If the
# build fails on another release, "auto" mode polls instead and prints why.
AGENT_CORE_SOURCE = r"""
// ---- the agent's core: standard C++17 only (no torch), so a test compiles it alone
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace vramscope_agent {

// PROTOCOL.md "Framing" and "Bounds a reader keeps"
constexpr size_t kMaxFrame = 64u * 1024 * 1024;
constexpr size_t kMaxString = 64 * 1024;
constexpr size_t kMaxStackFrames = 1024;
constexpr size_t kEntriesPerFrame = 4096;

// action 0 is a marker: addr = marker code, size = token
enum ActionCode : int32_t {
  kMarker = 0, kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree,
  kSegmentMap, kSegmentUnmap, kSnapshot, kOom, kUnknown
};

inline const char* action_name(int32_t code) {
  static const char* names[] = {"", "alloc", "free_requested", "free_completed", "segment_alloc",
                                "segment_free", "segment_map", "segment_unmap", "snapshot", "oom",
                                "unknown"};
  return (code >= 0 && code <= kUnknown) ? names[code] : "unknown";
}

template <class Ctx>
struct Rec {
  int32_t action = kMarker;
  int32_t device = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  int64_t stream = 0;
  int64_t time_us = 0;
  Ctx ctx{};
};

// Bounded multi-producer queue (Vyukov): each device's allocator lock is a
// separate producer; the drain is the one consumer. Push never blocks.
template <class Ctx>
class Ring {
 public:
  explicit Ring(size_t slots) : cells_(new Cell[slots]), mask_(slots - 1) {
    for (size_t i = 0; i < slots; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  bool push(Rec<Ctx>&& r) {
    size_t pos = enq_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      size_t seq = c.seq.load(std::memory_order_acquire);
      intptr_t dif = (intptr_t)seq - (intptr_t)pos;
      if (dif == 0) {
        if (enq_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.rec = std::move(r);
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        return false;
      } else {
        pos = enq_.load(std::memory_order_relaxed);
      }
    }
  }
  bool pop(Rec<Ctx>& out) {
    size_t pos = deq_.load(std::memory_order_relaxed);
    Cell& c = cells_[pos & mask_];
    size_t seq = c.seq.load(std::memory_order_acquire);
    if ((intptr_t)seq - (intptr_t)(pos + 1) < 0) return false;  // empty, or a push still writing
    deq_.store(pos + 1, std::memory_order_relaxed);  // one consumer
    out = std::move(c.rec);
    c.rec.ctx = Ctx{};
    c.seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

 private:
  struct Cell {
    std::atomic<size_t> seq{0};
    Rec<Ctx> rec;
  };
  std::unique_ptr<Cell[]> cells_;
  size_t mask_;
  alignas(64) std::atomic<size_t> enq_{0};
  alignas(64) std::atomic<size_t> deq_{0};
};

// ---- JSON, as PROTOCOL.md writes it: integers only, strings valid UTF-8

template <class Int>
void append_int(std::string& out, Int v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

// Length of the valid UTF-8 sequence at p (1-4), or 0 with *bad set to the
// length of its maximal invalid prefix (what Python's "replace" turns into one U+FFFD).
inline size_t utf8_sequence(const unsigned char* p, size_t n, size_t* bad) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) { len = 3; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) len = 3;
  else if (c == 0xED) { len = 3; hi = 0x9F; }  // no surrogates
  else if (c >= 0xEE && c <= 0xEF) len = 3;
  else if (c == 0xF0) { len = 4; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) { len = 4; hi = 0x8F; }
  else { *bad = 1; return 0; }
  size_t i = 1;
  for (; i < len && i < n; ++i) {
    unsigned char b = p[i];
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) break;
  }
  if (i == len) return len;
  *bad = i;
  return 0;
}

// A JSON string of s: invalid UTF-8 replaced by U+FFFD, and one longer than
// kMaxString bytes cut to at most kMaxString - 4 at a character boundary (as
// the Python side's _clean does).
inline void append_string(std::string& out, const char* s, size_t n) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string clean;
  clean.reserve(n < kMaxString ? n : kMaxString + 4);
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  for (size_t i = 0; i < n && clean.size() <= kMaxString;) {
    size_t bad = 0;
    size_t len = utf8_sequence(p + i, n - i, &bad);
    if (len) {
      clean.append(s + i, len);
      i += len;
    } else {
      clean.append(kReplacement, 3);
      i += bad;
    }
  }
  if (clean.size() > kMaxString) {
    size_t end = kMaxString - 4;
    while (end > 0 && (static_cast<unsigned char>(clean[end]) & 0xC0) == 0x80) --end;
    clean.resize(end);
  }
  static const char hex[] = "0123456789abcdef";
  out.push_back('"');
  for (unsigned char c : clean) {
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default:
        if (c < 0x20) {
          out.append("\\u00");
          out.push_back(hex[c >> 4]);
          out.push_back(hex[c & 15]);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

inline void append_string(std::string& out, const std::string& s) { append_string(out, s.data(), s.size()); }

// A frame: 4 bytes little-endian length, then the JSON. begin_frame returns
// where the frame starts; end_frame writes its length (false when over 64 MiB).
inline size_t begin_frame(std::string& out) {
  size_t at = out.size();
  out.append(4, '\0');
  return at;
}

inline bool end_frame(std::string& out, size_t at) {
  size_t n = out.size() - at - 4;
  if (n > kMaxFrame) return false;
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return true;
}

// ---- stacks: frames and stacks interned once, each new stack encoded once

struct Frame {
  std::string filename;
  int64_t line = 0;
  std::string name;
};

class StackInterner {
 public:
  explicit StackInterner(size_t max_stacks) : max_stacks_(max_stacks) {}

  uint32_t frame_id(const std::string& filename, int64_t line, const std::string& name) {
    key_.clear();
    append_int(key_, line);
    key_.push_back('\0');
    key_.append(filename);
    key_.push_back('\0');
    key_.append(name);
    auto it = frame_ids_.find(key_);
    if (it != frame_ids_.end()) return it->second;
    auto id = static_cast<uint32_t>(frames_.size());
    frames_.push_back(Frame{filename, line, name});
    frame_ids_.emplace(key_, id);
    return id;
  }

  // The stack's id (frame ids innermost first), or -1 for no frames or a full
  // table. A stack seen for the first time appends its `stack` frame to defs.
  int64_t intern(std::vector<uint32_t>& frames, std::vector<std::string>& defs) {
    if (frames.empty()) return -1;
    if (frames.size() > kMaxStackFrames) frames.resize(kMaxStackFrames);
    auto it = stack_ids_.find(frames);
    if (it != stack_ids_.end()) return it->second;
    if (stack_ids_.size() >= max_stacks_) {
      full_ = true;
      return -1;
    }
    auto id = static_cast<int64_t>(stack_ids_.size());
    stack_ids_.emplace(frames, id);
    defs.push_back(encode_stack(id, frames));
    return id;
  }

  size_t size() const { return stack_ids_.size(); }
  bool full() const { return full_; }

 private:
  struct VecHash {
    size_t operator()(const std::vector<uint32_t>& v) const {
      uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
      for (uint32_t x : v) h = (h ^ x) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };

  // A stack of huge names: keep its innermost frames that fit a frame.
  std::string encode_stack(int64_t id, const std::vector<uint32_t>& frames) const {
    for (size_t keep = frames.size();; keep /= 2) {
      std::string out;
      size_t at = begin_frame(out);
      out.append("{\"t\":\"stack\",\"id\":");
      append_int(out, id);
      out.append(",\"frames\":[");
      for (size_t i = 0; i < keep; ++i) {
        const Frame& f = frames_[frames[i]];
        out.append(i ? ",[" : "[");
        append_string(out, f.filename);
        out.push_back(',');
        append_int(out, f.line);
        out.push_back(',');
        append_string(out, f.name);
        out.push_back(']');
      }
      out.append("]}");
      if (end_frame(out, at) || keep == 0) return out;
    }
  }

  size_t max_stacks_;
  bool full_ = false;
  std::string key_;
  std::vector<Frame> frames_;
  std::unordered_map<std::string, uint32_t> frame_ids_;
  std::unordered_map<std::vector<uint32_t>, int64_t, VecHash> stack_ids_;
};

// Stack ids for symbolised tracebacks: all_frames and tracebacks as
// torch::symbolize returns them (FrameT has filename, lineno, funcname).
template <class FrameT>
std::vector<int64_t> intern_tracebacks(StackInterner& interner, const std::vector<FrameT>& all_frames,
                                       const std::vector<std::vector<uint64_t>>& tracebacks,
                                       std::vector<std::string>& defs) {
  std::vector<int64_t> frame_ids(all_frames.size(), -1);
  std::vector<int64_t> out;
  out.reserve(tracebacks.size());
  std::vector<uint32_t> ids;
  for (const auto& tb : tracebacks) {
    ids.clear();
    for (uint64_t idx : tb) {
      if (idx >= all_frames.size()) continue;
      if (frame_ids[idx] < 0) {
        const FrameT& f = all_frames[idx];
        frame_ids[idx] = interner.frame_id(f.filename, static_cast<int64_t>(f.lineno), f.funcname);
      }
      ids.push_back(static_cast<uint32_t>(frame_ids[idx]));
    }
    out.push_back(interner.intern(ids, defs));
  }
  return out;
}

// ---- a drained batch, encoded as `entries` frames

struct Entry {
  int32_t action = kMarker;
  int32_t device = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  int64_t stream = 0;
  int64_t time_us = 0;
  int64_t stack = -1;
};

struct EncodedFrame {
  std::string bytes;
  std::vector<int64_t> stacks;  // the ids its entries use, each once
  uint64_t count = 0;
};

// The entries (markers skipped) of batch[lo, hi) for each range, in order, as
// `entries` frames of at most kEntriesPerFrame, the first starting at seq `first`.
inline std::vector<EncodedFrame> encode_entries(const std::vector<Entry>& batch,
                                                const std::vector<std::pair<size_t, size_t>>& ranges,
                                                uint64_t first) {
  std::vector<EncodedFrame> out;
  EncodedFrame cur;
  size_t at = 0;
  auto finish = [&] {
    cur.bytes.append("]}");
    end_frame(cur.bytes, at);  // 4096 entries of at most ~150 bytes: far under 64 MiB
    std::sort(cur.stacks.begin(), cur.stacks.end());
    cur.stacks.erase(std::unique(cur.stacks.begin(), cur.stacks.end()), cur.stacks.end());
    first += cur.count;
    out.push_back(std::move(cur));
    cur = EncodedFrame{};
  };
  size_t left = 0;  // entries (and markers) still to encode: what a frame reserves for
  for (const auto& range : ranges)
    if (range.first < range.second) left += range.second - range.first;
  for (const auto& range : ranges) {
    for (size_t i = range.first; i < range.second && i < batch.size(); ++i, --left) {
      const Entry& e = batch[i];
      if (e.action == kMarker) continue;
      if (cur.count == 0) {
        cur.bytes.reserve(64 + 96 * std::min(kEntriesPerFrame, left));
        at = begin_frame(cur.bytes);
        cur.bytes.append("{\"t\":\"entries\",\"first\":");
        append_int(cur.bytes, first);
        cur.bytes.append(",\"entries\":[");
      }
      // one row into a local buffer, then one append: the drain's hot loop
      // at most 1 + 2 + 14 + 2 + 11 + 4 * 20 + 20 + 6 + 1 = 137 bytes; `end` only bounds to_chars
      char row[256];
      char* p = row;
      char* const end = row + 160;
      if (cur.count) *p++ = ',';
      *p++ = '[';
      *p++ = '"';
      const char* name = action_name(e.action);
      size_t len = std::strlen(name);
      std::memcpy(p, name, len);
      p += len;
      *p++ = '"';
      *p++ = ',';
      p = std::to_chars(p, end, e.device).ptr;
      *p++ = ',';
      p = std::to_chars(p, end, e.addr).ptr;
      *p++ = ',';
      p = std::to_chars(p, end, e.size).ptr;
      *p++ = ',';
      p = std::to_chars(p, end, e.stream).ptr;
      *p++ = ',';
      p = std::to_chars(p, end, e.time_us).ptr;
      *p++ = ',';
      if (e.stack < 0) {
        std::memcpy(p, "null", 4);
        p += 4;
      } else {
        p = std::to_chars(p, end, e.stack).ptr;
        cur.stacks.push_back(e.stack);
      }
      *p++ = ']';
      cur.bytes.append(row, static_cast<size_t>(p - row));
      if (++cur.count == kEntriesPerFrame) finish();
    }
  }
  if (cur.count) finish();
  return out;
}


// ---- the drain's side: one consumer, called with the GIL released (the
// torch part symbolises stacks between pop() and fill())

template <class Ctx>
class Drainer {
 public:
  explicit Drainer(size_t max_stacks) : interner_(max_stacks) {}

  static void pop(Ring<Ctx>& ring, size_t max_records, std::vector<Rec<Ctx>>& recs) {
    Rec<Ctx> r;
    while (recs.size() < max_records && ring.pop(r)) recs.push_back(std::move(r));
  }

  // The batch: recs with their stack ids (-1: none), contexts left in recs.
  void fill(const std::vector<Rec<Ctx>>& recs, const std::vector<int64_t>& stacks) {
    batch_.clear();
    batch_.reserve(recs.size());
    for (size_t i = 0; i < recs.size(); ++i) {
      const Rec<Ctx>& r = recs[i];
      batch_.push_back(Entry{r.action, r.device, r.addr, r.size, r.stream, r.time_us,
                             i < stacks.size() ? stacks[i] : -1});
    }
  }

  StackInterner& interner() { return interner_; }
  const std::vector<Entry>& batch() const { return batch_; }

 private:
  StackInterner interner_;
  std::vector<Entry> batch_;
};

}  // namespace vramscope_agent
"""

AGENT_TORCH_SOURCE = r"""
// ---- the torch-facing part
#include <torch/extension.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <chrono>
#include <mutex>
#include <tuple>

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace va = vramscope_agent;
using TraceEntry = cca::TraceEntry;
using Ctx = std::shared_ptr<c10::GatheredContext>;

std::atomic<bool> g_on{false};
std::atomic<va::Ring<Ctx>*> g_ring{nullptr};
std::atomic<uint64_t> g_lost{0};
std::once_flag g_attach_once;
std::mutex g_marker_mutex;
std::string g_marker_name;  // read by the RecordFunction callback
std::atomic<bool> g_marker_on{false};
at::CallbackHandle g_marker_handle = 0;
// One drain at a time. Taken only with the GIL released (a holder never waits for the GIL).
std::mutex g_drain_mutex;
std::unique_ptr<va::Drainer<Ctx>> g_drainer;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int32_t action_code(TraceEntry::Action a) {
  switch (a) {
    case TraceEntry::ALLOC: return va::kAlloc;
    case TraceEntry::FREE_REQUESTED: return va::kFreeRequested;
    case TraceEntry::FREE_COMPLETED: return va::kFreeCompleted;
    case TraceEntry::SEGMENT_ALLOC: return va::kSegmentAlloc;
    case TraceEntry::SEGMENT_FREE: return va::kSegmentFree;
    case TraceEntry::SEGMENT_MAP: return va::kSegmentMap;
    case TraceEntry::SEGMENT_UNMAP: return va::kSegmentUnmap;
    case TraceEntry::SNAPSHOT: return va::kSnapshot;
    case TraceEntry::OOM: return va::kOom;
    default: return va::kUnknown;
  }
}

// Runs inside the allocator's lock: copy and return; no GIL, no PyTorch call.
void on_trace(const TraceEntry& te) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  va::Ring<Ctx>* ring = g_ring.load(std::memory_order_acquire);
  if (ring == nullptr) return;
  va::Rec<Ctx> r;
  r.action = action_code(te.action_);
  r.device = static_cast<int32_t>(te.device_);
  r.addr = static_cast<uint64_t>(te.addr_);  // for an OOM: the free device bytes
  r.size = static_cast<uint64_t>(te.size_);
  r.stream = static_cast<int64_t>(reinterpret_cast<intptr_t>(te.stream_));
  r.time_us = now_us();
  r.ctx = te.context_;
  if (!ring->push(std::move(r))) g_lost.fetch_add(1, std::memory_order_relaxed);
}

void push_marker(int64_t code, int64_t token) {
  va::Ring<Ctx>* ring = g_ring.load(std::memory_order_acquire);
  if (ring == nullptr) return;
  va::Rec<Ctx> r;
  r.addr = static_cast<uint64_t>(code);
  r.size = static_cast<uint64_t>(token);
  r.time_us = now_us();
  if (!ring->push(std::move(r))) g_lost.fetch_add(1, std::memory_order_relaxed);
}

std::unique_ptr<at::ObserverContext> on_record_function(const at::RecordFunction& fn) {
  if (!g_marker_on.load(std::memory_order_relaxed)) return nullptr;
  const char* name = fn.name();
  size_t n = g_marker_name.size();
  if (name != nullptr && std::strncmp(name, g_marker_name.c_str(), n) == 0 &&
      (name[n] == '\0' || name[n] == '#')) {
    push_marker(3, 0);
  }
  return nullptr;
}

// A new session: a fresh stack table (ids restart with the helper's log).
void start(int64_t slots, const std::string& step_marker, int64_t max_stacks) {
  TORCH_CHECK(slots > 0 && (slots & (slots - 1)) == 0, "slots must be a power of two");
  TORCH_CHECK(max_stacks >= 0, "max_stacks must not be negative");
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    g_drainer.reset(new va::Drainer<Ctx>(static_cast<size_t>(max_stacks)));
  }
  if (g_ring.load() == nullptr) g_ring.store(new va::Ring<Ctx>(static_cast<size_t>(slots)));  // never freed
  std::call_once(g_attach_once, [] { cca::attachAllocatorTraceTracker(&on_trace); });
  std::lock_guard<std::mutex> guard(g_marker_mutex);
  if (!step_marker.empty() && g_marker_handle == 0) {
    g_marker_name = step_marker;
    g_marker_handle = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_record_function).scopes({at::RecordScope::USER_SCOPE}));
    g_marker_on.store(true);
  }
  g_on.store(true);
}

void stop() {
  g_on.store(false);  // the tracker cannot be detached: it returns at once from now on
  std::lock_guard<std::mutex> guard(g_marker_mutex);
  g_marker_on.store(false);
  if (g_marker_handle != 0) {
    at::removeCallback(g_marker_handle);
    g_marker_handle = 0;
  }
}

void mark(int64_t code, int64_t token) { push_marker(code, token); }

py::list bytes_list(const std::vector<std::string>& items) {
  py::list out;
  for (const auto& s : items) out.append(py::bytes(s.data(), s.size()));
  return out;
}

// Pops up to max_records into the batch, which replaces the last one, and
// returns (records in the batch, entries lost since the last drain, markers
// as (index, code, token, time_us), `stack` frames of the stacks first seen,
// ids in order). All of it runs without the GIL but torch::symbolize's Python
// part (one call per batch, none when no entry has a stack: PyTorch's
// appendSymbolized takes the GIL itself) and the Python results.
py::tuple drain(int64_t max_records) {
  std::vector<va::Rec<Ctx>> recs;
  uint64_t lost = 0;
  std::vector<std::string> defs;
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> marks;
  {
    py::gil_scoped_release nogil;
    {
      std::lock_guard<std::mutex> guard(g_drain_mutex);
      va::Ring<Ctx>* ring = g_ring.load(std::memory_order_acquire);
      if (ring != nullptr && g_drainer && max_records > 0)
        va::Drainer<Ctx>::pop(*ring, static_cast<size_t>(max_records), recs);
      lost = g_lost.exchange(0);  // after the pops: a loss among them is counted now
    }
    std::vector<torch::CapturedTraceback*> tracebacks;
    std::vector<int64_t> which(recs.size(), -1);
    for (size_t i = 0; i < recs.size(); ++i) {
      auto* tb = dynamic_cast<torch::CapturedTraceback*>(recs[i].ctx.get());
      if (tb != nullptr) {
        which[i] = static_cast<int64_t>(tracebacks.size());
        tracebacks.push_back(tb);
      }
    }
    torch::SymbolizedTracebacks sym;
    if (!tracebacks.empty()) sym = torch::symbolize(tracebacks);
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    if (g_drainer) {
      std::vector<int64_t> ids = va::intern_tracebacks(g_drainer->interner(), sym.all_frames, sym.tracebacks, defs);
      std::vector<int64_t> stacks(recs.size(), -1);
      for (size_t i = 0; i < recs.size(); ++i)
        if (which[i] >= 0 && static_cast<size_t>(which[i]) < ids.size()) stacks[i] = ids[which[i]];
      g_drainer->fill(recs, stacks);
    }
    for (size_t i = 0; i < recs.size(); ++i)
      if (recs[i].action == va::kMarker)
        marks.emplace_back(static_cast<int64_t>(i), static_cast<int64_t>(recs[i].addr),
                           static_cast<int64_t>(recs[i].size), recs[i].time_us);
  }
  size_t n = recs.size();
  recs.clear();  // drops the tracebacks with the GIL held: safe whether PyTorch frees their frames now or later
  py::list py_marks;
  for (const auto& m : marks)
    py_marks.append(py::make_tuple(std::get<0>(m), std::get<1>(m), std::get<2>(m), std::get<3>(m)));
  return py::make_tuple(n, lost, py_marks, bytes_list(defs));
}

// The batch's records [lo, hi) as (action, device, addr, size, stream,
// time_us, stack id|None); a marker as ("", 0, code, token, 0, time_us, None).
py::list rows(int64_t lo, int64_t hi) {
  std::vector<va::Entry> got;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    if (g_drainer) {
      const auto& batch = g_drainer->batch();
      size_t end = std::min(static_cast<size_t>(std::max<int64_t>(hi, 0)), batch.size());
      for (size_t i = static_cast<size_t>(std::max<int64_t>(lo, 0)); i < end; ++i) got.push_back(batch[i]);
    }
  }
  py::list out;
  for (const auto& e : got) {
    py::object stack = py::none();
    if (e.stack >= 0) stack = py::int_(e.stack);
    out.append(py::make_tuple(va::action_name(e.action), e.device, e.addr, e.size, e.stream, e.time_us, stack));
  }
  return out;
}

// The batch's entries in `ranges` ([lo, hi) pairs, in order) as `entries`
// frames from seq `first`: [(frame bytes, stack ids it uses, entries)].
py::list encode(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t first) {
  std::vector<va::EncodedFrame> frames;
  {
    py::gil_scoped_release nogil;
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& r : ranges)
      spans.emplace_back(static_cast<size_t>(std::max<int64_t>(r.first, 0)),
                         static_cast<size_t>(std::max<int64_t>(r.second, 0)));
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    if (g_drainer) frames = va::encode_entries(g_drainer->batch(), spans, static_cast<uint64_t>(first));
  }
  py::list out;
  for (const auto& f : frames) {
    py::list ids;
    for (int64_t id : f.stacks) ids.append(id);
    out.append(py::make_tuple(py::bytes(f.bytes.data(), f.bytes.size()), py::tuple(ids), f.count));
  }
  return out;
}

// A stack from Python (a state's block): (id|None, its `stack` frame if new|None).
py::tuple intern(const std::vector<std::tuple<std::string, int64_t, std::string>>& frames) {
  int64_t id = -1;
  std::vector<std::string> defs;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    if (g_drainer) {
      va::StackInterner& interner = g_drainer->interner();
      std::vector<uint32_t> ids;
      for (const auto& f : frames) ids.push_back(interner.frame_id(std::get<0>(f), std::get<1>(f), std::get<2>(f)));
      id = interner.intern(ids, defs);
    }
  }
  py::object sid = py::none();
  if (id >= 0) sid = py::int_(id);
  py::object def = py::none();
  if (!defs.empty()) def = py::bytes(defs[0].data(), defs[0].size());
  return py::make_tuple(sid, def);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start);
  m.def("stop", &stop);
  m.def("mark", &mark);
  m.def("drain", &drain);
  m.def("rows", &rows);
  m.def("encode", &encode);
  m.def("intern", &intern);
}
"""

AGENT_SOURCE = AGENT_CORE_SOURCE + AGENT_TORCH_SOURCE
