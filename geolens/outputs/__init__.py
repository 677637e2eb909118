"""What a reader sees: figures, reports and the paper's tables, built from runs and their analyses.

Owns figure specs and their plotly/matplotlib renderings (plots), one run's HTML report (report),
the paper's figures and tables from many runs (figures, tables), the published numbers (paper), seed
statistics (stats) and the lead table of the onset's precursors (precursor_table). May import every
layer below (errors, model, runs, training, sweeps, analysis); only the command line imports it.
"""
