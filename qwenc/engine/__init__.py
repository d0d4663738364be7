"""Generation: sampling, the one-sequence generation loop, and the batching engine."""
