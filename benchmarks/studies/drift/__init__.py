"""Studies of the query verdict and the drift report."""
