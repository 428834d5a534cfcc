// Unit tests of the stage-name grammar (stage_names.h), hand-computed. The
// expected names are those the Python tests expect of a live pipeline
// (tests/test_session.py, tests/test_root.py) and parse
// (tests/test_records.py).
// Built and run by tests/test_cc_units.py with plain g++; prints
// "<passed> passed, <failed> failed" and exits non-zero on a failure.
#include "intune_tf/cc/kernels/stage_names.h"

#include <string>

#include "tests/cc/unit_test.h"

namespace {

using tensorflow::intune::InputLabel;
using tensorflow::intune::InputStageName;
using tensorflow::intune::IsInterleaveLike;
using tensorflow::intune::IsMultiInput;
using tensorflow::intune::OutputStageName;
using tensorflow::intune::Sanitize;
using tensorflow::intune::StagePlace;
using unit_test::Check;

#define CHECK_NAME(a, b)                                                 \
  Check((a) == std::string(b), std::string(#a " == \"") + (b) +          \
                                   "\", got \"" + (a) + "\"", __LINE__)

// A node below `parent_stage` (whose node is `parent_type`), not at the
// output: input `position` of `siblings`, created right after its parent or
// not.
StagePlace Below(const std::string& parent_stage,
                 const std::string& parent_type, bool first = true,
                 int position = 0, int siblings = 1) {
  return {parent_stage, parent_type, /*parent_is_output=*/false, first,
          position, siblings};
}

// A node right below the pipeline's output, whose node is `output_type`.
StagePlace BelowOutput(const std::string& output_type) {
  return {OutputStageName(output_type), output_type,
          /*parent_is_output=*/true, /*first=*/true, 0, 1};
}

void TheRootIsLeftOut() {
  // Intune <- Prefetch <- ParallelMapV2: "Prefetch.ParallelMapV2".
  CHECK_NAME(OutputStageName("Intune"), "Intune");
  const std::string prefetch =
      InputStageName(BelowOutput("Intune"), "Prefetch");
  CHECK_NAME(prefetch, "Prefetch");
  CHECK_NAME(InputStageName(Below(prefetch, "Prefetch"), "ParallelMapV2"),
             "Prefetch.ParallelMapV2");
  CHECK_NAME(InputStageName(Below(prefetch, "Prefetch"), "Shuffle"),
             "Prefetch.Shuffle");
}

void OnlyTheRootAtTheOutputIsLeftOut() {
  // An output that is not the root keeps its name...
  CHECK_NAME(InputStageName(BelowOutput("Prefetch"), "ParallelMapV2"),
             "Prefetch.ParallelMapV2");
  // ...and a node named "Intune" below the output is a stage like another.
  CHECK_NAME(InputStageName(Below("Prefetch.Intune", "Intune"), "Range"),
             "Prefetch.Intune.Range");
}

void ZipInputsAreNamedByPosition() {
  // Prefetch.Zip with two branches: "[0]" and "[1]", whichever was created
  // first.
  CHECK_NAME(InputStageName(Below("Prefetch.Zip", "Zip", true, 0, 2),
                            "ParallelMapV2"),
             "Prefetch.Zip[0].ParallelMapV2");
  CHECK_NAME(InputStageName(Below("Prefetch.Zip", "Zip", false, 1, 2),
                            "ParallelMapV2"),
             "Prefetch.Zip[1].ParallelMapV2");
  // Zip right below the root: "Zip[1].ParallelMapV2".
  const std::string zip = InputStageName(BelowOutput("Intune"), "Zip");
  CHECK_NAME(InputStageName(Below(zip, "Zip", false, 1, 2), "ParallelMapV2"),
             "Zip[1].ParallelMapV2");
  // A multi-input stage with one live input still names it.
  CHECK_NAME(InputStageName(Below("Zip", "Zip", true, 0, 1), "Range"),
             "Zip[0].Range");
}

void ConcatenateInputsAreNamedByCreation() {
  // The first input is the one Initialize made (id = parent's + 1): "[0]";
  // the second is made later, when it is the only live input: "[1]".
  CHECK_NAME(InputStageName(Below("Prefetch.Concatenate", "Concatenate",
                                  /*first=*/true, 0, 1),
                            "ParallelMapV2"),
             "Prefetch.Concatenate[0].ParallelMapV2");
  CHECK_NAME(InputStageName(Below("Prefetch.Concatenate", "Concatenate",
                                  /*first=*/false, 0, 1),
                            "ParallelMapV2"),
             "Prefetch.Concatenate[1].ParallelMapV2");
}

void InterleaveElementsShareOneStage() {
  const std::string interleave = "Prefetch.BatchV2.ParallelInterleaveV4";
  // Its own input (made by its Initialize): no brackets.
  CHECK_NAME(InputStageName(Below(interleave, "ParallelInterleaveV4", true, 0,
                                  4),
                            "TensorSlice"),
             "Prefetch.BatchV2.ParallelInterleaveV4.TensorSlice");
  // Every per-element dataset, at any position: "[*]".
  for (int position = 1; position < 4; ++position) {
    CHECK_NAME(InputStageName(Below(interleave, "ParallelInterleaveV4", false,
                                    position, 4),
                              "ParallelMapV2"),
               "Prefetch.BatchV2.ParallelInterleaveV4[*].ParallelMapV2");
  }
  // Deeper inside: "ParallelInterleaveV4[*].ParallelMapV2.Range".
  const std::string inner = InputStageName(
      Below("ParallelInterleaveV4", "ParallelInterleaveV4", false, 1, 2),
      "ParallelMapV2");
  CHECK_NAME(InputStageName(Below(inner, "ParallelMapV2"), "Range"),
             "ParallelInterleaveV4[*].ParallelMapV2.Range");
  // The untracked wrapper of a function's dataset (tests/test_root.py).
  CHECK_NAME(InputStageName(Below("Prefetch.Interleave", "Interleave", false,
                                  1, 2),
                            "IntuneUntracked"),
             "Prefetch.Interleave[*].IntuneUntracked");
  // flat_map and group_by_window name theirs the same way.
  CHECK_NAME(InputStageName(Below("FlatMap", "FlatMap", false, 1, 2), "Map"),
             "FlatMap[*].Map");
  CHECK_NAME(InputStageName(Below("GroupByWindow", "GroupByWindow", false, 1,
                                  2),
                            "BatchV2"),
             "GroupByWindow[*].BatchV2");
}

void DirectedInterleaveIsMultiInput() {
  // Not interleave-like: its inputs are its own, by position.
  CHECK_NAME(InputStageName(Below("DirectedInterleave", "DirectedInterleave",
                                  false, 2, 3),
                            "Range"),
             "DirectedInterleave[2].Range");
  CHECK_NAME(InputStageName(Below("DirectedInterleave", "DirectedInterleave",
                                  true, 0, 3),
                            "Range"),
             "DirectedInterleave[0].Range");
}

void AnyStageWithSeveralInputsNamesThem() {
  CHECK_NAME(InputStageName(Below("Foo", "Foo", false, 1, 2), "Range"),
             "Foo[1].Range");
  CHECK_NAME(InputStageName(Below("Foo", "Foo", false, 0, 1), "Range"),
             "Foo.Range");
}

void Labels() {
  CHECK_NAME(InputLabel(Below("", "ParallelInterleaveV4", true, 0, 2)), "");
  CHECK_NAME(InputLabel(Below("", "ParallelInterleaveV4", false, 1, 2)),
             "[*]");
  CHECK_NAME(InputLabel(Below("", "Concatenate", true, 0, 2)), "[0]");
  CHECK_NAME(InputLabel(Below("", "Concatenate", false, 0, 1)), "[1]");
  CHECK_NAME(InputLabel(Below("", "ChooseFastest", false, 12, 13)), "[12]");
  CHECK_NAME(InputLabel(Below("", "Prefetch", false, 0, 1)), "");
}

void NodeNamesKeepWordCharacters() {
  CHECK_NAME(Sanitize("ParallelMapV2"), "ParallelMapV2");
  CHECK_NAME(Sanitize("Map:0/my-fn x"), "Map_0_my_fn_x");
  // Each byte of a non-ASCII character (UTF-8 "é" is two bytes): "_" each.
  CHECK_NAME(Sanitize("Caf\xc3\xa9"), "Caf__");
  CHECK_NAME(Sanitize(""), "");
  CHECK_NAME(OutputStageName("Map:0"), "Map_0");
  CHECK_NAME(InputStageName(Below("Prefetch", "Prefetch"), "My.Map"),
             "Prefetch.My_Map");
}

void Classification() {
  for (const char* type : {"Interleave", "ParallelInterleaveV4",
                           "LegacyParallelInterleaveV2", "FlatMap",
                           "GroupByWindow"}) {
    Check(IsInterleaveLike(type), std::string("interleave-like: ") + type,
          __LINE__);
  }
  for (const char* type : {"DirectedInterleave", "ParallelMapV2", "Zip",
                           "WeightedFlatMap", "FlatMapV2", "Prefetch"}) {
    Check(!IsInterleaveLike(type),
          std::string("not interleave-like: ") + type, __LINE__);
  }
  for (const char* type : {"Zip", "Concatenate", "DirectedInterleave",
                           "ChooseFastest", "ChooseFastestBranch",
                           "WeightedFlatMap"}) {
    Check(IsMultiInput(type), std::string("multi-input: ") + type, __LINE__);
  }
  for (const char* type : {"ParallelInterleaveV4", "FlatMap", "Prefetch",
                           "ZipV2", "Concatenate2"}) {
    Check(!IsMultiInput(type), std::string("not multi-input: ") + type,
          __LINE__);
  }
}

}  // namespace

int main() {
  TheRootIsLeftOut();
  OnlyTheRootAtTheOutputIsLeftOut();
  ZipInputsAreNamedByPosition();
  ConcatenateInputsAreNamedByCreation();
  InterleaveElementsShareOneStage();
  DirectedInterleaveIsMultiInput();
  AnyStageWithSeveralInputsNamesThem();
  Labels();
  NodeNamesKeepWordCharacters();
  Classification();
  return unit_test::Summary();
}
