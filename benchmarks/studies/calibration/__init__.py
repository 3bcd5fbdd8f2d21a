"""Studies of the flow calibrator's implementation."""
