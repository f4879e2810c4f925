"""Chapter 9's translator: its recipe (presets, configuration), its runs (checkpoints,
loading) and its training loop."""
