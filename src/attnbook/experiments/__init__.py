"""Every committed measurement: the one results format (store), the registry of named
experiments (``python -m attnbook run NAME``) and one module per experiment."""
