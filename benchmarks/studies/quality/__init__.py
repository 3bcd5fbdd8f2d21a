"""Studies of retrieval quality: calibration variants, ``auto``, passages."""
