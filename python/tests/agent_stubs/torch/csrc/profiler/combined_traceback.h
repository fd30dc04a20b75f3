#pragma once
#include <c10/cuda/CUDACachingAllocator.h>
#include <string>
#include <vector>
namespace torch {
namespace unwind {
struct Frame {
  std::string filename;
  std::string funcname;
  uint64_t lineno;
};
}  // namespace unwind
struct CapturedTraceback : public c10::GatheredContext {};
struct SymbolizedTracebacks {
  std::vector<unwind::Frame> all_frames;
  std::vector<std::vector<uint64_t>> tracebacks;
};
SymbolizedTracebacks symbolize(const std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch
