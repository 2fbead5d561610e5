"""Pipelines of several steps: the plan of segments, and the runner that runs one engine per
segment with barriers, reduces, gates and a ledger that a resume reads.
"""
