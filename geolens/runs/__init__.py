"""Run directories on disk: what a run leaves behind and how it is read back.

Owns the directory layout, atomic writes, safetensors and the background writer (storage), one
writer per folder (runlock), onset events from metrics rows (events), precursor events
(precursor_events), onset forecast rules and files (forecast), consistency checks, exact
repairs and the resume point (integrity), a run as an object (run), runs under a folder grouped
into configurations (runset) and trimmed copies (export). May import geolens.errors and
geolens.model; never training, sweeps, analysis or outputs.
"""
