// Test driver for the agent's core (AGENT_CORE_SOURCE in vramscope_live.py),
// built without torch by test_agent_core.py: `#include "agent_core.h"` is that
// source. It plays the torch part's role: pushes what the tracker would, drains
// with the same core calls, and stands in for torch::symbolize.
//
//   driver run SLOTS MAX_STACKS < commands     frames on stdout, events on stderr
//   driver bench N                             costs as JSON on stdout
//
// Commands, one per line; strings are hex after an `x` (so any bytes fit):
//   E action device addr size stream time_us K [xFILE line xNAME]*K   an entry
//   M code token time_us                                              a marker
//   D max                     drain: stack frames, then the batch's entries frames
//   S K [xFILE line xNAME]*K  intern a stack as Python does for a state's block
// stderr lines: `lost N`, `mark INDEX CODE TOKEN TIME`, `stack ID|none`.

#include "agent_core.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

namespace va = vramscope_agent;

struct SymFrame {  // torch::unwind::Frame's fields
  std::string filename;
  std::string funcname;
  uint64_t lineno;
};

struct Traceback {
  std::vector<SymFrame> frames;
};
using Ctx = std::shared_ptr<Traceback>;

struct Symbolized {
  std::vector<SymFrame> all_frames;
  std::vector<std::vector<uint64_t>> tracebacks;
};

// What torch::symbolize returns: frames shared across the batch, tracebacks as indices.
Symbolized symbolize(const std::vector<Traceback*>& tbs) {
  Symbolized out;
  std::map<std::tuple<std::string, std::string, uint64_t>, uint64_t> seen;
  for (const Traceback* tb : tbs) {
    std::vector<uint64_t> idx;
    for (const SymFrame& f : tb->frames) {
      auto key = std::make_tuple(f.filename, f.funcname, f.lineno);
      auto it = seen.find(key);
      if (it == seen.end()) {
        it = seen.emplace(key, out.all_frames.size()).first;
        out.all_frames.push_back(f);
      }
      idx.push_back(it->second);
    }
    out.tracebacks.push_back(idx);
  }
  return out;
}

std::string unhex(const std::string& tok) {
  std::string out;
  for (size_t i = 1; i + 1 < tok.size(); i += 2) out.push_back(static_cast<char>(std::stoi(tok.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<SymFrame> read_frames(std::istringstream& in) {
  size_t k = 0;
  in >> k;
  std::vector<SymFrame> frames;
  for (size_t i = 0; i < k; ++i) {
    std::string file, name;
    uint64_t line = 0;
    in >> file >> line >> name;
    frames.push_back(SymFrame{unhex(file), unhex(name), line});
  }
  return frames;
}

void write(const std::string& bytes) { std::fwrite(bytes.data(), 1, bytes.size(), stdout); }

// The extension's drain() and encode() for the whole batch, in one.
uint64_t drain(va::Ring<Ctx>& ring, va::Drainer<Ctx>& drainer, size_t max, uint64_t lost_before, uint64_t first) {
  std::vector<va::Rec<Ctx>> recs;
  va::Drainer<Ctx>::pop(ring, max, recs);
  std::vector<Traceback*> tbs;
  std::vector<int64_t> which(recs.size(), -1);
  for (size_t i = 0; i < recs.size(); ++i) {
    if (recs[i].ctx) {
      which[i] = static_cast<int64_t>(tbs.size());
      tbs.push_back(recs[i].ctx.get());
    }
  }
  Symbolized sym = symbolize(tbs);
  std::vector<std::string> defs;
  std::vector<int64_t> ids = va::intern_tracebacks(drainer.interner(), sym.all_frames, sym.tracebacks, defs);
  std::vector<int64_t> stacks(recs.size(), -1);
  for (size_t i = 0; i < recs.size(); ++i)
    if (which[i] >= 0) stacks[i] = ids[which[i]];
  drainer.fill(recs, stacks);
  if (lost_before) std::cerr << "lost " << lost_before << "\n";
  for (size_t i = 0; i < recs.size(); ++i)
    if (recs[i].action == va::kMarker)
      std::cerr << "mark " << i << " " << recs[i].addr << " " << recs[i].size << " " << recs[i].time_us << "\n";
  for (const auto& d : defs) write(d);
  uint64_t n = 0;
  for (const auto& f : va::encode_entries(drainer.batch(), {{0, drainer.batch().size()}}, first)) {
    write(f.bytes);
    n += f.count;
  }
  return n;
}

int run(size_t slots, size_t max_stacks) {
  va::Ring<Ctx> ring(slots);
  va::Drainer<Ctx> drainer(max_stacks);
  uint64_t lost = 0, next_seq = 0;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "E" || cmd == "M") {
      va::Rec<Ctx> r;
      if (cmd == "E") {
        in >> r.action >> r.device >> r.addr >> r.size >> r.stream >> r.time_us;
        auto frames = read_frames(in);
        if (!frames.empty()) r.ctx = std::make_shared<Traceback>(Traceback{frames});
      } else {
        in >> r.addr >> r.size >> r.time_us;
      }
      if (!ring.push(std::move(r))) ++lost;
    } else if (cmd == "D") {
      size_t max = 0;
      in >> max;
      next_seq += drain(ring, drainer, max, lost, next_seq);
      lost = 0;
    } else if (cmd == "S") {
      auto frames = read_frames(in);
      std::vector<uint32_t> ids;
      for (const auto& f : frames)
        ids.push_back(drainer.interner().frame_id(f.filename, static_cast<int64_t>(f.lineno), f.funcname));
      std::vector<std::string> defs;
      int64_t id = drainer.interner().intern(ids, defs);
      for (const auto& d : defs) write(d);
      if (id < 0) std::cerr << "stack none\n";
      else std::cerr << "stack " << id << "\n";
    } else if (!cmd.empty()) {
      std::cerr << "bad command " << cmd << "\n";
      return 2;
    }
  }
  std::fflush(stdout);
  return 0;
}

double ns_since(std::chrono::steady_clock::time_point t0) {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

int64_t now_us() {  // the torch part's clock
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The costs the module docstring quotes: the callback's push, and the drain's
// work per entry (pop, intern, encode) without and with stacks.
int bench(size_t n) {
  const size_t slots = 1 << 18, batch = 16384;
  va::Ring<Ctx> ring(slots);
  va::Drainer<Ctx> drainer(1000000);
  // 256 distinct stacks of 24 frames drawn from 400 frames, as a training loop's are
  std::vector<Ctx> stacks;
  for (int s = 0; s < 256; ++s) {
    auto tb = std::make_shared<Traceback>();
    for (int f = 0; f < 24; ++f) {
      int k = (s * 7 + f * 13) % 400;
      tb->frames.push_back(SymFrame{"/home/user/project/model/layer_" + std::to_string(k % 40) + ".py",
                                    "forward_" + std::to_string(k), static_cast<uint64_t>(10 + k)});
    }
    stacks.push_back(tb);
  }
  double push_ns = 0, plain_ns = 0, stacked_ns = 0;
  size_t pushed = 0, plain = 0, stacked = 0;
  uint64_t bytes = 0, first = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const bool with_stacks = pass == 1;
    for (size_t done = 0; done < n; done += batch) {
      auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < batch; ++i) {  // on_trace's work: copy the entry and its context
        va::Rec<Ctx> r;
        r.action = va::kAlloc + static_cast<int32_t>(i % 3);
        r.device = 0;
        r.addr = 139637976727552ull + 512 * i;
        r.size = 512 * (1 + i % 64);
        r.stream = 0;
        r.time_us = now_us();
        if (with_stacks) r.ctx = stacks[i % stacks.size()];
        ring.push(std::move(r));
      }
      push_ns += ns_since(t0);
      pushed += batch;
      t0 = std::chrono::steady_clock::now();
      std::vector<va::Rec<Ctx>> recs;
      va::Drainer<Ctx>::pop(ring, batch, recs);
      std::vector<Traceback*> tbs;
      for (auto& r : recs)
        if (r.ctx) tbs.push_back(r.ctx.get());
      auto ts = std::chrono::steady_clock::now();
      Symbolized sym = symbolize(tbs);  // the stand-in for torch::symbolize: not counted
      double sym_ns = ns_since(ts);
      std::vector<std::string> defs;
      std::vector<int64_t> ids = va::intern_tracebacks(drainer.interner(), sym.all_frames, sym.tracebacks, defs);
      drainer.fill(recs, with_stacks ? ids : std::vector<int64_t>{});
      auto frames = va::encode_entries(drainer.batch(), {{0, drainer.batch().size()}}, first);
      recs.clear();
      double spent = ns_since(t0) - sym_ns;
      for (const auto& f : frames) {
        bytes += f.bytes.size();
        first += f.count;
      }
      if (with_stacks) {
        stacked_ns += spent;
        stacked += batch;
      } else {
        plain_ns += spent;
        plain += batch;
      }
    }
  }
  std::printf(
      "{\"push_ns_per_entry\":%.1f,\"drain_ns_per_entry\":%.1f,\"drain_with_stacks_ns_per_entry\":%.1f,"
      "\"entries\":%zu,\"bytes_per_entry\":%.1f}\n",
      push_ns / static_cast<double>(pushed), plain_ns / static_cast<double>(plain),
      stacked_ns / static_cast<double>(stacked), plain + stacked,
      static_cast<double>(bytes) / static_cast<double>(plain + stacked));
  return 0;
}

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "run" && argc == 4) return run(std::stoul(argv[2]), std::stoul(argv[3]));
  if (mode == "bench" && argc == 3) return bench(std::stoul(argv[2]));
  std::cerr << "usage: driver run SLOTS MAX_STACKS | driver bench N\n";
  return 2;
}
