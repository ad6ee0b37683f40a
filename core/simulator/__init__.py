"""Training-job simulator with fault injection."""
