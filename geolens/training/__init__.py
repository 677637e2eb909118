"""Training runs: the per-epoch loop of a single run and of stacked members, and what it records.

Owns the device and the chosen engine's forward (engine), the optimizers (optimizers), memory and time
estimates (resources),
the records a loop writes and reads back to resume (recording), the progress bar (progress_bar),
the loop itself with the single run (train) and many members stacked (batched). May import
geolens.errors, geolens.model and geolens.runs; never sweeps, analysis or outputs.
"""
