"""One byte formatter (attnscope.core.units) behind every size AttnScope prints; unit boundaries."""

import pytest
from attnscope.core import kv_formula as kv
from attnscope.core.bench import overhead_report
from attnscope.core.loading import fit
from attnscope.core.units import format_bytes


def test_one_mebibyte_rolls_over():  # 1,048,576 B printed as "1020 KiB"
    assert format_bytes(1_048_576, binary=True) == "1.00 MiB"
    assert kv.format_bytes(1_048_576, binary=True) == "1.00 MiB"


@pytest.mark.parametrize(
    ("n", "binary", "text"),
    [
        (0, False, "0 B"),
        (999, False, "999 B"),
        (1000, False, "1.00 kB"),
        (999_499, False, "999 kB"),
        (999_500, False, "1.00 MB"),  # 999.5 kB rounds up to the next unit
        (999_499_999, False, "999 MB"),
        (999_500_000, False, "1.00 GB"),
        (999_500_000_000, False, "1.00 TB"),
        (1_234_567, False, "1.23 MB"),
        (12_345_678, False, "12.3 MB"),
        (123_456_789, False, "123 MB"),
        (1023, True, "1023 B"),
        (1024, True, "1.00 KiB"),
        (1025, True, "1.00 KiB"),
        (1_047_552, True, "1023 KiB"),  # 4 digits needed below 1024: whole units
        (1_048_575, True, "1.00 MiB"),
        (2**30 - 1, True, "1.00 GiB"),
        (2**30, True, "1.00 GiB"),
        (2**40, True, "1.00 TiB"),
        (1536, True, "1.50 KiB"),
        (268_435_456, True, "256 MiB"),
        (-1_048_576, True, "-1.00 MiB"),
        (999.6, False, "1.00 kB"),
        (2.4, False, "2 B"),
    ],
)
def test_every_unit_boundary(n, binary, text):
    assert format_bytes(n, binary=binary) == text


def test_formatters_share_the_one_module():
    for n in (999, 1000, 999_500, 1_048_576, 21_474_836_480, 335_544_320):
        one = format_bytes(n)
        assert fit.human_bytes(n) == one
        assert kv.format_bytes(n) == one
        assert overhead_report._fmt_b(n) == one
    assert fit.human_bytes(None) == "?" and overhead_report._fmt_b(None) == "—"
    assert format_bytes(335_544_320, digits=2) == "340 MB"


def test_no_formatter_prints_four_digit_decimal_or_1024():
    for k in range(1, 60):
        for n in (2**k - 1, 2**k, 10 ** (k // 3) * 999_5 // 10):
            d, b = format_bytes(n), format_bytes(n, binary=True)
            num_d, num_b = float(d.split()[0]), float(b.split()[0])
            assert num_d < 1000 or d.endswith(" EB"), d
            assert num_b < 1024 or b.endswith(" EiB"), b


def test_bad_digits():
    with pytest.raises(ValueError):
        format_bytes(10, digits=0)
    with pytest.raises(ValueError):
        format_bytes(float("nan"))


def test_count_is_singular_for_exactly_one():
    from attnscope.core.units import count

    assert (
        count(1, "layer") == "1 layer"
        and count(30, "layer") == "30 layers"
        and count(0, "model") == "0 models"
    )
    assert count(1, "query head") == "1 query head" and count(2, "KV head") == "2 KV heads"
    assert count(1_024, "token") == "1,024 tokens" and count(2, "child", "children") == "2 children"
