"""Studies of the flow density as an out-of-distribution signal."""
