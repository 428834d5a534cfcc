// The attributes that carry a pipeline's `experimental_intune` option in its
// graph (IntuneOptionsDataset, IntuneRootDataset): the one list from which come
// the attribute name constants, the Settings struct and its defaults
// (kernels/settings.h), FromAttrs and ToAttrs (kernels/settings.cc), the
// ops' `.Attr` specs (ops/intune_ops.cc) and the defaults of the rewrite
// passes' options (rewrites/rewrite.h). Python's field table
// (intune_tf/option_fields.py) names the same attributes; the test
// tests/test_option_fields.py reads this list as text and checks that both
// sides, the op registry and docs/options.md agree.
//
// X(Constant, name, C++ type, TF attr type, default): the attribute `name`,
// whose constant is k<Constant>; `default` is both the C++ initializer and
// the attr's default (stringified), so it must be a literal both accept.
#ifndef INTUNE_TF_CC_SETTINGS_FIELDS_H_
#define INTUNE_TF_CC_SETTINGS_FIELDS_H_

#include <cstdint>
#include <string>

// clang-format off
#define INTUNE_SETTINGS_FIELDS(X)                                    \
  /* The IntuneOptions JSON, shown by session listings. */           \
  X(Tag, tag, std::string, string, "")                               \
  /* False when the option was set to False. */                      \
  X(Enabled, enabled, bool, bool, true)                              \
  /* Bytes the buffers may hold; 0: the default where it runs. */   \
  X(RamBudget, ram_budget, int64_t, int, 0)                          \
  /* Size of a private runner pool; 0: the iterator's runner. */     \
  X(MaxCpus, max_cpus, int64_t, int, 0)                              \
  /* How often the budget guard checks buffered bytes. */            \
  X(GuardPeriodUs, guard_period_us, int64_t, int, 5000)              \
  /* The rewrite passes' options (rewrites/rewrite.h). */            \
  X(IncludeFixed, include_fixed, bool, bool, false)                  \
  X(InsertPrefetch, insert_prefetch, bool, bool, false)              \
  X(InnerStats, inner_stats, bool, bool, false)                      \
  /* Records per interleave input; 0: TF's buffers. */               \
  X(InterleaveBuffer, interleave_buffer, int64_t, int, 16)           \
  /* Cache where the pipeline stops changing between epochs. */      \
  X(Cache, cache, bool, bool, true)
// clang-format on

namespace tensorflow {
namespace intune {

// The attributes' values, each with its default.
struct SettingValues {
#define INTUNE_SETTING_MEMBER(constant, name, cc_type, attr_type, value) \
  cc_type name = value;
  INTUNE_SETTINGS_FIELDS(INTUNE_SETTING_MEMBER)
#undef INTUNE_SETTING_MEMBER
};

// The `.Attr(...)` spec of each field, for chaining in REGISTER_OP.
#define INTUNE_SETTING_ATTR_SPEC(constant, name, cc_type, attr_type, value) \
  .Attr(#name ": " #attr_type " = " #value)

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_SETTINGS_FIELDS_H_
