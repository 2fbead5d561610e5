"""The run: the engine that wires and owns it, the dispatcher and command handler around the
state they share, the feeder, batching, the lanes and their slots, and the outage pause.
"""
