"""warpdeck control room (Textual)."""
