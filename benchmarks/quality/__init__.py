"""Suite: retrieval and similarity quality (STS, QNLI, the dev sets through the CLI)."""
