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

# rewrites/rewrite.h: kOptimizerName; intune_tf/cc/op_names.h: kRootOp,
# kLegacyRootOp, kIntuneOptionsOp.
OPTIMIZER_NAME = "intune_rewrites"
ROOT_OP = "IntuneRootDataset"
LEGACY_ROOT_OP = "IntuneDataset"
OPTIONS_OP = "IntuneOptionsDataset"
# The wrapper of untrack_inner (intune_tf/cc/op_names.h: kUntrackedOp).
UNTRACKED_OP = "IntuneUntrackedDataset"
# The cache of insert_cache (intune_tf/cc/op_names.h: kCacheOp).
CACHE_OP = "IntuneCacheDataset"
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
    cache_point: the node insert_cache put the cache above; "" if none.
    cache_reason: why there, or why nowhere; "" when the pass did not run.
  """
  graph_def: graph_pb2.GraphDef
  fixed: dict[str, int]
  skipped: list[str]
  structure_changed: bool
  fingerprint: str
  cache_point: str = ""
  cache_reason: str = ""


def _run(graph_def: graph_pb2.GraphDef, include_fixed: bool,
         insert_prefetch: bool, inner_stats: bool,
         interleave_buffer: int | None, cache: bool) -> tuple:
  with tf.init_scope():
    return _kernels.ops().intune_rewrite_graph(
        graph_def=graph_def.SerializeToString(), include_fixed=include_fixed,
        insert_prefetch=insert_prefetch, inner_stats=inner_stats,
        interleave_buffer=interleave_buffer or 0, cache=cache)


def run_passes(graph_def: graph_pb2.GraphDef, *, include_fixed: bool = False,
               insert_prefetch: bool = False, inner_stats: bool = False,
               interleave_buffer: int | None = 16,
               cache: bool = True) -> Result:
  """Runs every pass on `graph_def`, as the root does (`RunPasses`).

  In order: strip_roots, make_tunable, insert_cache, insert_prefetch,
  untrack_inner,
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
    cache: put InTune's cache where the pipeline stops changing between
      epochs (insert_cache). Default True.

  Returns:
    The rewritten graph and what the passes did.

  Raises:
    tf.errors.InvalidArgumentError: `graph_def` is unusable (two nodes with
      one name).
  """
  (rewritten, names, values, skipped, changed, fingerprint, _, point,
   reason) = _run(graph_def, include_fixed, insert_prefetch, inner_stats,
                  interleave_buffer, cache)
  return Result(
      graph_def=graph_pb2.GraphDef.FromString(rewritten.numpy()),
      fixed={n.decode(): int(v) for n, v in zip(names.numpy(), values.numpy())},
      skipped=[s.decode() for s in skipped.numpy()],
      structure_changed=bool(changed.numpy()),
      fingerprint=fingerprint.numpy().decode(),
      cache_point=point.numpy().decode(),
      cache_reason=reason.numpy().decode())


def rewrite_graph(graph_def: graph_pb2.GraphDef, *,
                  include_fixed: bool = False, insert_prefetch: bool = False,
                  inner_stats: bool = False,
                  interleave_buffer: int | None = 16, cache: bool = True
                  ) -> tuple[graph_pb2.GraphDef, dict[str, int]]:
  """Runs every pass on `graph_def` (`run_passes`, same arguments).

  Returns:
    The rewritten graph, and the fixed values made tunable by node name.
  """
  result = run_passes(graph_def, include_fixed=include_fixed,
                      insert_prefetch=insert_prefetch,
                      inner_stats=inner_stats,
                      interleave_buffer=interleave_buffer, cache=cache)
  return result.graph_def, result.fixed


def fingerprint(graph_def: graph_pb2.GraphDef) -> str:
  """The warm-start fingerprint of a dataset graph (see `GraphFingerprint`
  in `rewrites/passes.h`, its one definition)."""
  return run_passes(graph_def, insert_prefetch=False,
                    inner_stats=True).fingerprint


@dataclasses.dataclass(frozen=True)
class CachePoint:
  """Where a dataset graph stops changing between epochs (`FindCachePoint`
  in `rewrites/passes.h`).

  Attributes:
    node: the node whose elements are the same every epoch, above which the
      cache goes; "" when there is none.
    reason: what ends the pure part of the pipeline, or why there is no
      point.
  """
  node: str
  reason: str


def cache_point(graph_def: graph_pb2.GraphDef) -> CachePoint:
  """Where InTune's cache goes in `graph_def` (the `IntuneCachePoint` op).

  Args:
    graph_def: a dataset graph; not modified.

  Returns:
    The node and why there (or why nowhere).
  """
  with tf.init_scope():
    node, reason = _kernels.ops().intune_cache_point(
        graph_def=graph_def.SerializeToString())
  return CachePoint(node=node.numpy().decode(), reason=reason.numpy().decode())


def rewriter_config(*, include_fixed: bool = False,
                    insert_prefetch: bool = False, inner_stats: bool = False,
                    interleave_buffer: int | None = 16, cache: bool = True
                    ) -> rewriter_config_pb2.RewriterConfig:
  """The `RewriterConfig` the root gives `data::RewriteDataset` for these
  options (`MakeRewriterConfig`; arguments as for `run_passes`)."""
  config = _run(graph_pb2.GraphDef(), include_fixed, insert_prefetch,
                inner_stats, interleave_buffer, cache)[6]
  return rewriter_config_pb2.RewriterConfig.FromString(config.numpy())


__all__ = ["AUTOTUNE", "CACHE_OP", "CachePoint", "LEGACY_ROOT_OP",
           "OPTIMIZER_NAME", "OPTIONS_OP", "ROOT_OP", "Result", "UNTRACKED_OP",
           "cache_point", "fingerprint", "rewrite_graph", "rewriter_config",
           "run_passes"]
