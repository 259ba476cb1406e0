"""Spark's numeric options (spark/options.py), without a SparkSession: nan and ±inf are
refused at load with the option's name (float() takes them; a nan timeout passed every
check, an infinite one hung on a dead member)."""

from __future__ import annotations

import pytest

from dledger.spark.options import ClientOptions, OptionError, get_float


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_a_float_option_refuses_nan_and_infinities(raw: str) -> None:
    with pytest.raises(OptionError, match="option clientTimeoutSeconds: must be a finite number"):
        ClientOptions.from_options({"clientTimeoutSeconds": raw})
    with pytest.raises(OptionError, match="option writeTimeoutSeconds"):
        get_float({"writeTimeoutSeconds": raw}, "writeTimeoutSeconds", 1.0)


def test_a_finite_float_option_still_loads() -> None:
    assert ClientOptions.from_options({"clientTimeoutSeconds": "2.5"}).timeout == 2.5
    assert get_float({}, "timeoutSeconds", 10.0) == 10.0
    with pytest.raises(OptionError, match="must be positive"):
        get_float({"timeoutSeconds": "0"}, "timeoutSeconds", 10.0)
