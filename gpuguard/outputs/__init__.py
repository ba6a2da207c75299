"""Renderers of results: terminal table, JSON, Prometheus text."""
