// Lookups by name in a registry's table of {kind, name} entries, which an X-macro list
// (TFPS_OPTIMIZERS, TFPS_ADMISSION_POLICIES, TFPS_EVICTION_POLICIES) generates.
#ifndef TFPS_CORE_REGISTRY_H_
#define TFPS_CORE_REGISTRY_H_

#include <cstddef>
#include <string>

namespace tfps {

template <typename Kind>
struct NamedKind {
  Kind kind;
  const char* name;
};

template <typename Kind, size_t N>
const char* NameOf(const NamedKind<Kind> (&entries)[N], Kind kind) {
  for (const NamedKind<Kind>& e : entries) {
    if (e.kind == kind) return e.name;
  }
  return "unknown";
}

template <typename Kind, size_t N>
bool ParseName(const NamedKind<Kind> (&entries)[N], const std::string& name, Kind* kind) {
  for (const NamedKind<Kind>& e : entries) {
    if (name == e.name) {
      *kind = e.kind;
      return true;
    }
  }
  return false;
}

// "a, b, c": the known names, for an error message.
template <typename Kind, size_t N>
std::string JoinNames(const NamedKind<Kind> (&entries)[N]) {
  std::string out;
  for (const NamedKind<Kind>& e : entries) out += (out.empty() ? "" : ", ") + std::string(e.name);
  return out;
}

}  // namespace tfps

#endif  // TFPS_CORE_REGISTRY_H_
