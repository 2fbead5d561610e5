"""Where a run meets the outside: its spec (config), sources and their inputs, sinks, the journal
and resuming from it.
"""
