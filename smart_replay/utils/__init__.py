"""Helpers every layer may use: argument checks and progress log lines."""
