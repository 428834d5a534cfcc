// The C++ unit tests' harness: checks that count, and the summary line
// tests/test_cc_units.py reads ("<passed> passed, <failed> failed").
#ifndef INTUNE_TF_TESTS_CC_UNIT_TEST_H_
#define INTUNE_TF_TESTS_CC_UNIT_TEST_H_

#include <cstdio>
#include <string>

namespace unit_test {

inline int passed = 0;
inline int failed = 0;

inline void Check(bool ok, const std::string& what, int line) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAILED line %d: %s\n", line, what.c_str());
  }
}

// Prints the summary; the process's exit code.
inline int Summary() {
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace unit_test

#define CHECK(a) ::unit_test::Check((a), #a, __LINE__)

#endif  // INTUNE_TF_TESTS_CC_UNIT_TEST_H_
