"""Grids of runs: which members a sweep has, where they live, and running them.

Owns member configs, folders, their state on disk and jobs (grid), and running a grid on local
worker processes or Ray with sweep.json and progress (sweep). May import geolens.errors,
geolens.model, geolens.runs and geolens.training; never analysis or outputs.
"""
