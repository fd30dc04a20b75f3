#pragma once
#include <cstdint>
#include <memory>
#include <unordered_set>
namespace at {
enum class RecordScope : uint8_t { FUNCTION = 0, USER_SCOPE };
struct ObserverContext { virtual ~ObserverContext() = default; };
struct RecordFunction { const char* name() const; };
using CallbackHandle = uint64_t;
class RecordFunctionCallback {
 public:
  using StartCallback = std::unique_ptr<ObserverContext> (*)(const RecordFunction&);
  using EndCallback = void (*)(const RecordFunction&, ObserverContext*);
  explicit RecordFunctionCallback(StartCallback start, EndCallback end = nullptr);
  RecordFunctionCallback& scopes(const std::unordered_set<RecordScope, std::hash<RecordScope>>& scopes);
};
CallbackHandle addGlobalCallback(const RecordFunctionCallback& cb);
void removeCallback(CallbackHandle handle);
}  // namespace at
