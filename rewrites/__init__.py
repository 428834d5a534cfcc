"""Dataset-graph rewrites that prepare a pipeline for InTune.

The passes are C++ (`rewrites/passes.h`, run by `RunPasses` in
`rewrites/rewrite.h`): the `IntuneRootDataset` root runs them on its input
through TF's `data::RewriteDataset`, as the Grappler optimizer
`OPTIMIZER_NAME`. This module runs the same passes on a `GraphDef` through
the `IntuneRewriteGraph` op, for tests and debugging.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import rewriter_config_pb2

from intune_tf.ops import loader as _kernels

# rewrites/rewrite.h: kOptimizerName, kRootOp, kLegacyRootOp.
OPTIMIZER_NAME = "intune_rewrites"
ROOT_OP = "IntuneRootDataset"
LEGACY_ROOT_OP = "IntuneDataset"
OPTIONS_OP = "IntuneOptionsDataset"
# The wrapper of untrack_inner (rewrites/graph_utils.h: kUntrackedOp).
UNTRACKED_OP = "IntuneUntrackedDataset"
AUTOTUNE = -1


@dataclasses.dataclass(frozen=True)
class Result:
  """What the passes did to a graph (`rewrites::Report`).

  Attributes:
    graph_def: the rewritten graph.
    fixed: the user's fixed values made tunable, by node name.
    skipped: one line per pass that could not apply, and why.
    structure_changed: whether datasets were added or removed.
    fingerprint: the warm-start fingerprint of the graph before the passes.
  """
  graph_def: graph_pb2.GraphDef
  fixed: dict[str, int]
  skipped: list[str]
  structure_changed: bool
  fingerprint: str


def _run(graph_def: graph_pb2.GraphDef, include_fixed: bool,
         insert_prefetch: bool, inner_stats: bool,
         interleave_buffer: int | None) -> tuple:
  with tf.init_scope():
    return _kernels.ops().intune_rewrite_graph(
        graph_def=graph_def.SerializeToString(), include_fixed=include_fixed,
        insert_prefetch=insert_prefetch, inner_stats=inner_stats,
        interleave_buffer=interleave_buffer or 0)


def run_passes(graph_def: graph_pb2.GraphDef, *, include_fixed: bool = False,
               insert_prefetch: bool = False, inner_stats: bool = False,
               interleave_buffer: int | None = 16) -> Result:
  """Runs every pass on `graph_def`, as the root does (`RunPasses`).

  In order: strip_roots, make_tunable, insert_prefetch, untrack_inner,
  raise_interleave_buffers, disable_tf_autotune (see `rewrites/passes.h`).
  The defaults are those of `IntuneOptions()` (the field table
  `intune_tf.option_fields`, as the graph carries them).

  Args:
    graph_def: a dataset graph; not modified.
    include_fixed: also make fixed stages tunable. Default False.
    insert_prefetch: add prefetches after parallel stages. Default False.
    inner_stats: record statistics inside interleaves' per-element datasets;
      False runs the untrack_inner pass. Default False.
    interleave_buffer: results each input of a parallel interleave of
      records buffers; None or 0 keeps TF's. Default 16.

  Returns:
    The rewritten graph and what the passes did.

  Raises:
    tf.errors.InvalidArgumentError: `graph_def` is unusable (two nodes with
      one name).
  """
  (rewritten, names, values, skipped, changed, fingerprint,
   _) = _run(graph_def, include_fixed, insert_prefetch, inner_stats,
             interleave_buffer)
  return Result(
      graph_def=graph_pb2.GraphDef.FromString(rewritten.numpy()),
      fixed={n.decode(): int(v) for n, v in zip(names.numpy(), values.numpy())},
      skipped=[s.decode() for s in skipped.numpy()],
      structure_changed=bool(changed.numpy()),
      fingerprint=fingerprint.numpy().decode())


def rewrite_graph(graph_def: graph_pb2.GraphDef, *,
                  include_fixed: bool = False, insert_prefetch: bool = False,
                  inner_stats: bool = False,
                  interleave_buffer: int | None = 16
                  ) -> tuple[graph_pb2.GraphDef, dict[str, int]]:
  """Runs every pass on `graph_def` (`run_passes`, same arguments).

  Returns:
    The rewritten graph, and the fixed values made tunable by node name.
  """
  result = run_passes(graph_def, include_fixed=include_fixed,
                      insert_prefetch=insert_prefetch,
                      inner_stats=inner_stats,
                      interleave_buffer=interleave_buffer)
  return result.graph_def, result.fixed


def fingerprint(graph_def: graph_pb2.GraphDef) -> str:
  """The warm-start fingerprint of a dataset graph (see `GraphFingerprint`
  in `rewrites/passes.h`, its one definition)."""
  return run_passes(graph_def, insert_prefetch=False,
                    inner_stats=True).fingerprint


def rewriter_config(*, include_fixed: bool = False,
                    insert_prefetch: bool = False, inner_stats: bool = False,
                    interleave_buffer: int | None = 16
                    ) -> rewriter_config_pb2.RewriterConfig:
  """The `RewriterConfig` the root gives `data::RewriteDataset` for these
  options (`MakeRewriterConfig`; arguments as for `run_passes`)."""
  config = _run(graph_pb2.GraphDef(), include_fixed, insert_prefetch,
                inner_stats, interleave_buffer)[-1]
  return rewriter_config_pb2.RewriterConfig.FromString(config.numpy())


__all__ = ["AUTOTUNE", "LEGACY_ROOT_OP", "OPTIMIZER_NAME", "OPTIONS_OP",
           "ROOT_OP", "Result", "UNTRACKED_OP", "fingerprint", "rewrite_graph",
           "rewriter_config", "run_passes"]
