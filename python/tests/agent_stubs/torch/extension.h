#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
struct _object;
namespace pybind11 {
struct object {
  _object* ptr() const { return p; }
  _object* p = nullptr;
};
struct none : object {};
struct int_ : object {
  explicit int_(int64_t) {}
};
struct bytes : object {
  bytes(const char*, size_t) {}
};
struct list : object {
  template <class T> void append(T&&) {}
};
struct tuple : object {
  tuple() = default;
  explicit tuple(const object&) {}
};
struct gil_scoped_release {
  gil_scoped_release() {}
  ~gil_scoped_release() {}
};
struct gil_scoped_acquire {
  gil_scoped_acquire() {}
  ~gil_scoped_acquire() {}
};
template <class... A> tuple make_tuple(A&&...) { return {}; }
struct module_ {
  template <class F> module_& def(const char*, F&&) { return *this; }
};
}  // namespace pybind11
namespace py = pybind11;
#define TORCH_EXTENSION_NAME stub_ext
#define PYBIND11_MODULE(name, m) void pybind11_init_##name(py::module_& m)
#define TORCH_CHECK(cond, ...) ((void)(cond))
