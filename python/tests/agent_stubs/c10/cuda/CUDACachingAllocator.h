#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
typedef struct CUstream_st* cudaStream_t;
namespace c10 {
using DeviceIndex = int8_t;
struct GatheredContext { virtual ~GatheredContext() = default; };
namespace cuda::CUDACachingAllocator {
struct TraceEntry {
  enum Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP,
                SEGMENT_UNMAP, SNAPSHOT, OOM, USER_DEFINED };
  Action action_;
  DeviceIndex device_;
  size_t addr_;
  std::shared_ptr<GatheredContext> context_;
  cudaStream_t stream_{};
  size_t size_;
};
using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;
void attachAllocatorTraceTracker(AllocatorTraceTracker tracker);
}  // namespace cuda::CUDACachingAllocator
}  // namespace c10
