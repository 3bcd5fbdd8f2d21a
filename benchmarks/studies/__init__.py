"""Studies: questions already settled, kept runnable (not part of ``run --suite``)."""
