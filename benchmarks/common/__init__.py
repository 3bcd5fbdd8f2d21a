"""What the benchmarks share: the harness, the corpora, the dev sets, extra encoders."""
