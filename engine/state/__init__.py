"""The state of a run: tasks and their keys, leases, batch records, snapshots and their
builder, figures, the board's columns and the report.
"""
