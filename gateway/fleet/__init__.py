"""The backends: membership, discovery, health and load."""
