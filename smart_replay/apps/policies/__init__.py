"""Baseline policies used to populate starter buffers."""
