"""Widgets of the control room, one per module."""
