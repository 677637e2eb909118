"""What a run is: its configuration, its task's data and the model's forward.

Owns GeoConfig and its presets (config), checkpoint schedules (schedule), the datasets and seeded
splits (tasks), GeoTransformer with its hook points (transformer), the bounded readout (readout),
the exact post-norm decompositions (cache, decompose), the plain-PyTorch reference forward
(plain_model), the exact fast one-layer forward and backward (fast), the deep engine for every depth and
placement (deep) and the engine interface that chooses between them (engines). May import only
geolens.errors: nothing here knows about run directories, training loops or analysis.
"""
