"""The argument types of the `intune` commands."""

import argparse
import re

import pytest

from intune_tf import arguments


@pytest.mark.parametrize("text,expected",
                         [("1", 1), ("3", 3), ("60000", 60000)])
def test_positive_int_takes_one_or_more(text, expected):
  assert arguments.positive_int(text) == expected


@pytest.mark.parametrize("text", ["0", "-2", "x", "1.5", ""])
def test_positive_int_refuses_the_rest(text):
  with pytest.raises(argparse.ArgumentTypeError,
                     match="^" + re.escape(f"{text!r} is not a positive "
                                           "integer; pass 1 or more.") + "$"):
    arguments.positive_int(text)


@pytest.mark.parametrize("text,expected", [("1", 1), ("64", 64),
                                           ("512", 512)])
def test_int_in_takes_its_range(text, expected):
  assert arguments.int_in(1, 512, "pool size")(text) == expected


@pytest.mark.parametrize("text", ["0", "513", "-1", "x", "nan", "1.5", ""])
def test_int_in_refuses_the_rest(text):
  with pytest.raises(argparse.ArgumentTypeError,
                     match="^" + re.escape(f"{text!r} is not a pool size; "
                                           "pass 1 to 512.") + "$"):
    arguments.int_in(1, 512, "pool size")(text)
