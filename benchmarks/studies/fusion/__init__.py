"""Studies of hybrid fusion rules."""
