"""Environments shipped with smart_replay (no downloads)."""
