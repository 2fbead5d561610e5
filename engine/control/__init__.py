"""The MQTT control plane: workers' birth, heartbeats and death, the monitor that convicts dead,
frozen and stuck workers, the engine's telemetry and its signed commands (DESIGN.md section 5).

Every topic string is built in ``topics``; every payload is a model in ``wire``, validated once
at the socket. Nothing here imports the TUI; the engine runs without a broker.
"""
