"""``livesight bench``: benchmarks that print numbers and ratios against a baseline of the same run."""
