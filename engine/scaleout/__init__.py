"""Scale-out: the engine's batches run on Ray actors, one long-lived actor per GPU.

Importing this package loads no Ray. ``raylink`` is the one module that imports ``ray`` (lazily,
inside its functions; an import-linter contract keeps it that way), so a single-machine run never
loads Ray and an engine without ``warpdeck[ray]`` installed still works.

- ``jobs``: what crosses Ray (a batch's inputs out, its outputs back) as frozen dataclasses.
- ``worker``/``actor_host``: the actor's body: real lanes on its own backend, fed by the engine.
- ``dispatch``/``executor``: the engine's side: a lane per remote lane, leases, epochs, restarts.
"""
