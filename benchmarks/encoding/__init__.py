"""Suite: encoding throughput, calibration cost, the cold single query."""
