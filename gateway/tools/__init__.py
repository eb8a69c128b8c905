"""Offline commands: plan, kv, explain, demo."""
