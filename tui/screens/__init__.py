"""Screens of the control room, one per module."""
