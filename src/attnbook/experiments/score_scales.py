"""The command of chapter 4's measurement of attention-score scales (the measurement itself is
:mod:`attnbook.experiments.scales`):

    python -m attnbook score_scales --run runs/cpu-base/medium --average 5 \\
        --out results/cpu/score_scales.json
"""
from __future__ import annotations


