"""Book tooling: the diagrams, the attention explorer's export, the homework sheets."""
