"""The real Kubernetes parts the test suite runs: pinned Go modules (one folder per component,
because their dependency graphs conflict) and the Python that builds and starts them on loopback."""
