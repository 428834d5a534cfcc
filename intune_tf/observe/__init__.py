"""Observability: status files, the decision log and `intune inspect`."""
