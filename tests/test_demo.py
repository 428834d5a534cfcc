"""The demo (the README's first command) runs and moves the knobs."""

import gc

import pytest

from intune_tf import demo


@pytest.mark.slow
def test_demo_phases_move_knobs_and_report_throughput():
  results = demo.run(seconds_per_phase=0.4)
  assert [label.split(":")[0] for label, _, _ in results][0] == "unoptimized"
  assert all(rows > 0 for _, rows, _ in results)
  parallelism = [max(v for k, v in knobs.items() if k.endswith("parallelism"))
                 for _, _, knobs in results]
  assert parallelism[0] == 1 and max(parallelism) >= 1
  assert results[2][2] != results[0][2]  # "all CPUs to the first UDF"
  gc.collect()
