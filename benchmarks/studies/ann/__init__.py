"""Studies of the ANN tuner."""
