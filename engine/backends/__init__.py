"""Array backends: NumPy always (``numpy_backend``), CuPy when asked for or when ``auto`` finds a
device (``cupy_backend``, chosen in ``select``), the streams and markers they share (``base``), and
the host's worker processes and shared memory (``process_pool``, ``shared_memory``).

This root imports nothing: a fill or sink worker process imports ``process_pool`` and
``shared_memory`` only, and the stream machinery (asyncio, the markers) would add a tenth of a
second to every worker's start.
"""
