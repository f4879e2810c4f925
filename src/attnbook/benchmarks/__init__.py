"""The benchmark suite of the appendix "Performance": attention kernels, models, the suite
(``python -m attnbook benchmarks``)."""
