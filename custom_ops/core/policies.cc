#include "custom_ops/core/policies.h"

#include "custom_ops/core/registry.h"

namespace tfps {
namespace {

#define TFPS_ADMISSION_ENTRY(k, name) {AdmissionKind::k, name},
constexpr NamedKind<AdmissionKind> kAdmissionPolicies[] = {
    TFPS_ADMISSION_POLICIES(TFPS_ADMISSION_ENTRY)};
#undef TFPS_ADMISSION_ENTRY

#define TFPS_EVICTION_ENTRY(k, name, sweeps, keeps_score) {EvictionKind::k, name},
constexpr NamedKind<EvictionKind> kEvictionPolicies[] = {TFPS_EVICTION_POLICIES(TFPS_EVICTION_ENTRY)};
#undef TFPS_EVICTION_ENTRY

}  // namespace

const char* AdmissionPolicyName(AdmissionKind kind) { return NameOf(kAdmissionPolicies, kind); }
bool ParseAdmissionPolicy(const std::string& name, AdmissionKind* kind) {
  return ParseName(kAdmissionPolicies, name, kind);
}
std::string AdmissionPolicyNames() { return JoinNames(kAdmissionPolicies); }

const char* EvictionPolicyName(EvictionKind kind) { return NameOf(kEvictionPolicies, kind); }
bool ParseEvictionPolicy(const std::string& name, EvictionKind* kind) {
  return ParseName(kEvictionPolicies, name, kind);
}
std::string EvictionPolicyNames() { return JoinNames(kEvictionPolicies); }

}  // namespace tfps
