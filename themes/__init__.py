"""warpdeck themes."""
