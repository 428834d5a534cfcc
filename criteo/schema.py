"""The Criteo click-log schema and the values the package uses for gaps.

One row of the Kaggle Display Advertising Challenge (`dac`) data, and of the
Criteo 1TB `day_N` files, is `label \\t I1..I13 \\t C1..C26`: 40 tab-separated
fields, an empty field meaning a missing value. `I*` are integer counts (some
columns carry negatives, e.g. I2 has -1 and -2), `C*` are categorical ids
written as 8 lowercase hexadecimal characters.

Conventions of this package (every reader and pipeline follows them):

* `features["dense"]`: float32 `[B, 13]`, the raw integer values of I1..I13;
  a missing value reads as `MISSING_DENSE` (0.0).
* `features["sparse"]`: int64 `[B, 26]`, C1..C26 parsed as hexadecimal
  numbers (`"0a1b2c3d"` -> 0x0a1b2c3d = 169552957); a missing value reads as
  `MISSING_SPARSE` (-1), which no hexadecimal id can take.
* `label`: float32 `[B]`, 0.0 or 1.0; rows of an unlabelled file (the
  competition's test layout, 39 fields) read as `UNLABELLED` (-1.0).
"""

from __future__ import annotations

NUM_DENSE: int = 13
NUM_SPARSE: int = 26
DENSE_NAMES: tuple[str, ...] = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
SPARSE_NAMES: tuple[str, ...] = tuple(f"C{i}" for i in range(1, NUM_SPARSE + 1))
# Canonical (labelled) field order; index 0 is the label.
FIELD_NAMES: tuple[str, ...] = ("label",) + DENSE_NAMES + SPARSE_NAMES
NUM_FIELDS: int = len(FIELD_NAMES)  # 40
NUM_TEST_FIELDS: int = NUM_FIELDS - 1  # 39: the unlabelled test layout.
# Rows whose trailing empty fields were stripped keep at least this many
# fields (of the 40 canonical ones); a shorter row is a bad row by default.
MIN_FIELDS: int = 37

MISSING_DENSE: float = 0.0
MISSING_SPARSE: int = -1
UNLABELLED: float = -1.0
# Categorical ids hold at most this many hexadecimal digits (32 bits).
MAX_HEX_DIGITS: int = 8

# File layouts the reader recognises (see `reader.sniff`).
LAYOUT_TSV = "tsv"  # label + 39 features, tab-separated (dac, day_N).
LAYOUT_TSV_TEST = "tsv_test"  # 39 features, no label (dac test.txt).
LAYOUT_CSV = "csv"  # Kaggle CSV: `Id,Label,I1..C26` header, commas.
LAYOUT_CSV_TEST = "csv_test"  # Kaggle CSV test: `Id,I1..C26` header.
LAYOUTS: tuple[str, ...] = (LAYOUT_TSV, LAYOUT_TSV_TEST, LAYOUT_CSV,
                            LAYOUT_CSV_TEST)
