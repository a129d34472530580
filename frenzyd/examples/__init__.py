"""Example jobs shipped with frenzyd (torchrun-style scripts run by the demo and the tests)."""
