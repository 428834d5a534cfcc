// Unit tests of the stage-name grammar (stage_names.h), hand-computed. The
// expected names are those the Python tests expect of a live pipeline
// (tests/test_session.py, tests/test_root.py) and parse
// (tests/test_records.py).
// Built and run by tests/test_cc_units.py with plain g++; prints
// "<passed> passed, <failed> failed" and exits non-zero on a failure.
#include "intune_tf/cc/kernels/stage_names.h"

#include <cstdint>
#include <map>
#include <string>

#include "tests/cc/unit_test.h"

namespace {

using tensorflow::intune::InputLabel;
using tensorflow::intune::InputStageName;
using tensorflow::intune::IsInterleaveLike;
using tensorflow::intune::IsMultiInput;
using tensorflow::intune::ModelNode;
using tensorflow::intune::NamedStage;
using tensorflow::intune::NameModelStages;
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
  return {parent_stage, parent_type, /*parent_is_root=*/false, first,
          position, siblings};
}

// A node right below the pipeline's output, whose node is `output_type` (the
// root, left out, if it is "Intune").
StagePlace BelowOutput(const std::string& output_type) {
  return {OutputStageName(output_type), output_type,
          /*parent_is_root=*/output_type == "Intune", /*first=*/true, 0, 1};
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

// The stage names and bounded flags of a whole model, as "<stage>" or
// "<stage>!" (bounded), by node id; checks that each node's parent is the
// node whose name its own extends.
std::map<int64_t, std::string> Named(int64_t output,
                                     const std::map<int64_t, ModelNode>& nodes,
                                     const std::string& root = "Intune") {
  std::map<int64_t, std::string> out;
  const std::map<int64_t, NamedStage> all =
      NameModelStages(output, nodes, root, "IntuneBufferRelease",
                      "IntuneCache");
  for (const auto& [id, named] : all) {
    out[id] = named.stage + (named.bounded ? "!" : "");
  }
  for (const auto& [id, named] : all) {
    if (named.parent < 0) {
      CHECK(id == output || nodes.at(output).name == "IntuneCache");
      continue;
    }
    const std::string& above = all.at(named.parent).stage;
    CHECK(above == root ||
          named.stage.compare(0, above.size(), above) == 0);
  }
  return out;
}

void AWholeModelIsNamedAsALiveSessionNamesIt() {
  // Intune(1) <- Prefetch(2) <- Zip(3) <- {ParallelMapV2(4) <- Range(5),
  // ParallelMapV2(6) <- Range(7)}: the root is left out; the zip's inputs by
  // position; ids 4..7 as in tests/test_session.py's zip of two branches.
  const std::map<int64_t, ModelNode> nodes = {
      {1, {"Intune", {2}}},         {2, {"Prefetch", {3}}},
      {3, {"Zip", {4, 6}}},         {4, {"ParallelMapV2", {5}}},
      {5, {"Range", {}}},           {6, {"ParallelMapV2", {7}}},
      {7, {"Range", {}}}};
  const std::map<int64_t, std::string> expected = {
      {1, "Intune"},
      {2, "Prefetch"},
      {3, "Prefetch.Zip"},
      {4, "Prefetch.Zip[0].ParallelMapV2"},
      {5, "Prefetch.Zip[0].ParallelMapV2.Range"},
      {6, "Prefetch.Zip[1].ParallelMapV2"},
      {7, "Prefetch.Zip[1].ParallelMapV2.Range"}};
  CHECK(Named(1, nodes) == expected);
  // A top node not named `root` keeps its name: TF's AUTOTUNE model, whose
  // top node is "Root", named with root "Root" and with "Intune".
  const std::map<int64_t, ModelNode> tf_model = {
      {1, {"Root", {2}}}, {2, {"ParallelMapV2", {3}}}, {3, {"Range", {}}}};
  CHECK(Named(1, tf_model, "Root") ==
        (std::map<int64_t, std::string>{
            {1, "Root"}, {2, "ParallelMapV2"}, {3, "ParallelMapV2.Range"}}));
  CHECK(Named(1, tf_model) ==
        (std::map<int64_t, std::string>{{1, "Root"},
                                        {2, "Root.ParallelMapV2"},
                                        {3, "Root.ParallelMapV2.Range"}}));
}

void InterleaveInputsAreNamedByCreation() {
  // Interleave(1) <- {TensorSlice(2), Map(5), Map(7)}: its own input was made
  // right after it (id 2); the per-element datasets share "[*]".
  const std::map<int64_t, ModelNode> nodes = {
      {1, {"ParallelInterleaveV4", {2, 5, 7}}},
      {2, {"TensorSlice", {}}},
      {5, {"Map", {}}},
      {7, {"Map", {}}}};
  CHECK(Named(1, nodes) == (std::map<int64_t, std::string>{
                               {1, "ParallelInterleaveV4"},
                               {2, "ParallelInterleaveV4.TensorSlice"},
                               {5, "ParallelInterleaveV4[*].Map"},
                               {7, "ParallelInterleaveV4[*].Map"}}));
}

void ReleaseNodesArePassedThroughAndBoundTheirInput() {
  // Prefetch(1) <- release(2) <- interleave(3) <- Range(4): the release is
  // not named; the interleave is bounded; the input "first" is judged by the
  // release's id (2 = 1 + 1).
  std::map<int64_t, ModelNode> nodes = {
      {1, {"Prefetch", {2}}},
      {2, {"IntuneBufferRelease", {3}}},
      {3, {"ParallelInterleaveV4", {4}}},
      {4, {"Range", {}}}};
  CHECK(Named(1, nodes) ==
        (std::map<int64_t, std::string>{
            {1, "Prefetch"},
            {3, "Prefetch.ParallelInterleaveV4!"},
            {4, "Prefetch.ParallelInterleaveV4.Range"}}));
  // Two releases in a row (a rewrite run twice): the node below both.
  nodes[3] = {"IntuneBufferRelease", {4}};
  nodes[4] = {"ParallelInterleaveV4", {}};
  CHECK(Named(1, nodes) ==
        (std::map<int64_t, std::string>{
            {1, "Prefetch"}, {4, "Prefetch.ParallelInterleaveV4!"}}));
  // A release with two inputs is an ordinary node.
  nodes = {{1, {"IntuneBufferRelease", {2, 3}}},
           {2, {"Range", {}}},
           {3, {"Range", {}}}};
  CHECK(Named(1, nodes) ==
        (std::map<int64_t, std::string>{{1, "IntuneBufferRelease"},
                                        {2, "IntuneBufferRelease[0].Range"},
                                        {3, "IntuneBufferRelease[1].Range"}}));
  // A cycle of releases (no real model has one) ends, each node named once.
  nodes = {{1, {"Prefetch", {2}}},
           {2, {"IntuneBufferRelease", {3}}},
           {3, {"IntuneBufferRelease", {2}}}};
  CHECK(Named(1, nodes).size() <= nodes.size());
}

void CacheNodesArePassedThroughUnbounded() {
  // Prefetch(1) <- cache(2) <- ParallelMapV2(3) <- Range(4): a stage's name
  // is the same with the cache on or off, and the cache bounds nothing.
  std::map<int64_t, ModelNode> nodes = {
      {1, {"Prefetch", {2}}},
      {2, {"IntuneCache", {3}}},
      {3, {"ParallelMapV2", {4}}},
      {4, {"Range", {}}}};
  CHECK(Named(1, nodes) ==
        (std::map<int64_t, std::string>{
            {1, "Prefetch"},
            {3, "Prefetch.ParallelMapV2"},
            {4, "Prefetch.ParallelMapV2.Range"}}));
  // A cache above a release: the interleave below both is bounded.
  nodes = {{1, {"Prefetch", {2}}},
           {2, {"IntuneCache", {3}}},
           {3, {"IntuneBufferRelease", {4}}},
           {4, {"ParallelInterleaveV4", {}}}};
  CHECK(Named(1, nodes) ==
        (std::map<int64_t, std::string>{
            {1, "Prefetch"}, {4, "Prefetch.ParallelInterleaveV4!"}}));
  // A cache at the top: its input is the output.
  nodes = {{1, {"IntuneCache", {2}}},
           {2, {"ParallelMapV2", {3}}},
           {3, {"Range", {}}}};
  CHECK(Named(2, nodes) == Named(1, nodes));
  CHECK(Named(1, nodes).at(2) == "ParallelMapV2");
  // A cache whose input is not made (every element from the cache): alone.
  nodes = {{1, {"Prefetch", {2}}}, {2, {"IntuneCache", {}}}};
  CHECK(Named(1, nodes) ==
        (std::map<int64_t, std::string>{
            {1, "Prefetch"}, {2, "Prefetch.IntuneCache"}}));
}

void MissingNodesAreSkipped() {
  // An output that is not in the model: nothing. An input id that is not:
  // left out, also of the count of siblings (Zip's one live input is "[0]").
  CHECK(Named(9, {{1, {"Range", {}}}}).empty());
  CHECK(Named(1, {{1, {"Zip", {8, 2}}}, {2, {"Range", {}}}}) ==
        (std::map<int64_t, std::string>{{1, "Zip"}, {2, "Zip[0].Range"}}));
  // A node reached twice keeps its first name (breadth first).
  CHECK(Named(1, {{1, {"Zip", {2, 3}}},
                  {2, {"Map", {3}}},
                  {3, {"Range", {}}}}) ==
        (std::map<int64_t, std::string>{
            {1, "Zip"}, {2, "Zip[0].Map"}, {3, "Zip[1].Range"}}));
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
  AWholeModelIsNamedAsALiveSessionNamesIt();
  InterleaveInputsAreNamedByCreation();
  ReleaseNodesArePassedThroughAndBoundTheirInput();
  CacheNodesArePassedThroughUnbounded();
  MissingNodesAreSkipped();
  return unit_test::Summary();
}
