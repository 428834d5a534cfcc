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
