"""Headless pipeline engine for warpdeck."""
