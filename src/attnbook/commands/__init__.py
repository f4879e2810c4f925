"""The translator's command lines: train, evaluate, translate (thin: the work is in
:mod:`attnbook.training` and the library)."""
